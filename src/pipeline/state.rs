//! [`StreamState`]: the bookkeeping of one output stream (HDFS's
//! `DFSOutputStream` with its `dataQueue` and `ackQueue`), without I/O or
//! locks, so that unit tests drive it step by step.
//!
//! `write()` fills the current packet. A full packet is sealed into the
//! data queue while fewer than `max_in_flight` packets are in flight
//! (sealed and not yet acknowledged) and the write buffer grants it a unit
//! (a stream's first packet in flight needs none); otherwise the write's
//! remaining bytes wait as the blocked write (backpressure) until acks
//! make room. The streamer takes jobs from the front of the data queue; a
//! packet it takes moves to the ack queue until every replica wrote it,
//! and acknowledgements come in the packets' order. Barriers (flush, sync,
//! close, truncate) sit in the data queue between packets and run once
//! everything before them is acknowledged.
//!
//! Completions ([`Done`]) are handed back to the caller, never called
//! here: the caller calls them once it has let go of the lock this state
//! lives under.

use std::collections::VecDeque;

use super::budget::Unit;
use super::ctx::Done;
use crate::error::{FsError, FsResult};

/// The sizes a stream works with.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    pub packet_size: usize,
    pub max_in_flight: usize,
    pub block_size: u64,
}

/// Bytes of the file from `off` on, written to every replica as one unit.
pub(crate) struct Packet {
    pub off: u64,
    pub data: Vec<u8>,
}

impl Packet {
    /// The file offset just past the packet.
    pub fn end(&self) -> u64 {
        self.off + self.data.len() as u64
    }
}

/// Ordered work for the streamer: packets, and barriers that complete
/// once everything before them is acknowledged.
pub(crate) enum Job {
    Packet(Packet),
    Flush(Done),
    Sync(Done),
    Close(Done),
    Truncate(u64, Done),
}

/// The barrier right behind a stream's last packet that the streamer
/// completes together with it ([`StreamState::take_ending`]).
pub(crate) enum Ending {
    Close(Done),
    Sync(Done),
}

/// A barrier: completes once everything written before it is
/// acknowledged (and, for `Sync`, durable; for `Close`, recorded closed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Barrier {
    Flush,
    Sync,
    Close,
}

impl Barrier {
    fn job(self, done: Done) -> Job {
        match self {
            Barrier::Flush => Job::Flush(done),
            Barrier::Sync => Job::Sync(done),
            Barrier::Close => Job::Close(done),
        }
    }
}

/// An entry of the data queue: a job, and for a packet its share of the
/// write buffer (none for a stream's only packet in flight, and for
/// barriers).
struct Queued {
    job: Job,
    unit: Option<Unit>,
}

/// A packet the streamer took that is not acknowledged yet.
struct Unacked {
    end: u64,
    /// Held until the acknowledgement, which gives it back to the write
    /// buffer.
    _unit: Option<Unit>,
}

/// A write that found the in-flight bound reached: the bytes not yet in
/// packets, and its completion (called once all are in).
struct BlockedWrite {
    rest: Vec<u8>,
    done: Done,
}

/// What the streamer is to do next.
pub(crate) enum Next {
    Job(Job),
    /// The stream failed: these completions get the error. The streamer
    /// stops.
    Failed(FsError, Vec<Done>),
    /// Nothing queued: the streamer stops.
    Idle,
}

/// A barrier or truncation asked for: completed at once, or queued.
pub(crate) enum Enqueued {
    Now(Done, FsResult<()>),
    Queued,
}

/// What a unit handed over by the write buffer did.
pub(crate) struct Granted {
    /// The blocked write, when all of its bytes are in packets now.
    pub done: Option<Done>,
    /// Units the stream no longer needs: the caller drops them (gives them
    /// back) once it has let go of the stream's lock.
    pub spare: Vec<Unit>,
}

/// A source of write-buffer units: `None` means the stream now waits in
/// the buffer's queue and will be handed a unit later.
pub(crate) type TakeUnit<'a> = &'a mut dyn FnMut() -> Option<Unit>;

pub(crate) struct StreamState {
    limits: Limits,
    /// Bytes accepted from the writer: where the next write must start.
    pos: u64,
    /// Bytes acknowledged by every replica: the visible length.
    acked: u64,
    /// The packet being filled, and its file offset.
    packet: Vec<u8>,
    packet_off: u64,
    data_queue: VecDeque<Queued>,
    ack_queue: VecDeque<Unacked>,
    /// Packets sealed and not yet acknowledged (in either queue).
    in_flight: usize,
    peak_in_flight: usize,
    /// The open block's replicas take queued packets merged into one
    /// write (see [`Self::merge_following`]): the bound is then twice
    /// `max_in_flight`, so that one write's worth of packets queues while
    /// the one before is out. Else each merged write was followed by one
    /// of the packet or two the writer had sealed in the meantime, and a
    /// sequential writer to an object store sent every other PUT nearly
    /// empty.
    merging: bool,
    /// Units of the write buffer handed to this stream and not yet used.
    units: Vec<Unit>,
    /// Queued for a unit of the write buffer.
    wants_unit: bool,
    /// A streamer is running (at most one per stream).
    running: bool,
    blocked: Option<BlockedWrite>,
    failed: Option<FsError>,
    mtime: Option<i64>,
    /// Anything written or truncated through this stream yet: an untouched
    /// stream flushes and closes without any work.
    dirty: bool,
}

impl StreamState {
    /// A stream positioned at the end of a file of `size` bytes.
    pub fn new(limits: Limits, size: u64) -> StreamState {
        StreamState {
            limits,
            pos: size,
            acked: size,
            packet: Vec::new(),
            packet_off: size,
            data_queue: VecDeque::new(),
            ack_queue: VecDeque::new(),
            in_flight: 0,
            peak_in_flight: 0,
            merging: false,
            units: Vec::new(),
            wants_unit: false,
            running: false,
            blocked: None,
            failed: None,
            mtime: None,
            dirty: false,
        }
    }

    /// Bytes acknowledged by every replica.
    pub fn visible_len(&self) -> u64 {
        self.acked
    }

    /// Where the next write must start.
    pub fn pos(&self) -> u64 {
        self.pos
    }

    pub fn mtime(&self) -> Option<i64> {
        self.mtime
    }

    pub fn set_mtime(&mut self, mtime: i64) {
        self.mtime = Some(mtime);
    }

    pub fn is_dirty(&self) -> bool {
        self.dirty
    }

    pub fn failed(&self) -> Option<&FsError> {
        self.failed.as_ref()
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    pub fn peak_in_flight(&self) -> usize {
        self.peak_in_flight
    }

    /// Packets that may be in flight now.
    pub fn in_flight_bound(&self) -> usize {
        self.limits.max_in_flight * if self.merging { 2 } else { 1 }
    }

    /// Whether the block being written merges queued packets (the
    /// streamer's word, before each job it takes). A bound that grew lets
    /// a blocked write go on (its completion is returned).
    pub fn set_merging(&mut self, on: bool, take_unit: TakeUnit<'_>) -> Option<Done> {
        let grew = on && !self.merging;
        self.merging = on;
        if grew && self.failed.is_none() {
            self.resume_blocked(take_unit)
        } else {
            None
        }
    }

    /// Whether a write at `offset` (`None`: at the end, O_APPEND) may go
    /// on: not on a failed stream, and only at the stream's end.
    pub fn check_write(&self, offset: Option<u64>) -> FsResult<()> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        match offset {
            Some(off) if off != self.pos => Err(FsError::OutOfOrderWrite {
                expected: self.pos,
                got: off,
            }),
            _ => Ok(()),
        }
    }

    /// Takes `data` (checked with [`Self::check_write`]) into packets, as
    /// far as the in-flight bound and the write buffer allow: returns
    /// `done` when all of it is in, else keeps the rest and `done` as the
    /// blocked write. The kernel sends one write of a file at a time (it
    /// holds the inode lock), so at most one write is ever blocked.
    pub fn accept(
        &mut self,
        data: &[u8],
        done: Done,
        now: i64,
        take_unit: TakeUnit<'_>,
    ) -> Option<Done> {
        let taken = self.copy_in(data, take_unit);
        self.mtime = Some(now);
        self.dirty = true;
        if taken == data.len() {
            return Some(done);
        }
        self.blocked = Some(BlockedWrite {
            rest: data[taken..].to_vec(),
            done,
        });
        None
    }

    /// Copies as much of `data` into packets as the in-flight bound and
    /// the write buffer allow; returns how many bytes it took. A full
    /// packet is sealed only while fewer than the bound
    /// ([`Self::in_flight_bound`]) are
    /// unacknowledged, and, unless it is the stream's only one in flight,
    /// with a unit of the write buffer.
    fn copy_in(&mut self, data: &[u8], take_unit: TakeUnit<'_>) -> usize {
        let mut taken = 0;
        loop {
            if !self.packet.is_empty() && self.packet_room(self.packet_off, self.packet.len()) == 0
            {
                if self.in_flight >= self.in_flight_bound() || !self.may_seal(take_unit) {
                    return taken;
                }
                self.seal_packet();
            }
            if taken == data.len() {
                return taken;
            }
            if self.packet.is_empty() {
                self.packet_off = self.pos;
                if self.packet.capacity() == 0 {
                    self.packet.reserve_exact(self.limits.packet_size);
                }
            }
            let room = self.packet_room(self.packet_off, self.packet.len());
            let take = room.min(data.len() - taken);
            self.packet.extend_from_slice(&data[taken..taken + take]);
            self.pos += take as u64;
            taken += take;
        }
    }

    /// Whether a full packet may go in flight now: the stream's first one
    /// always; any other with a unit of the write buffer, taken now or
    /// handed over earlier. Without one the stream queues for it (once).
    fn may_seal(&mut self, take_unit: TakeUnit<'_>) -> bool {
        if self.in_flight == 0 || !self.units.is_empty() {
            return true;
        }
        if self.wants_unit {
            return false;
        }
        match take_unit() {
            Some(u) => {
                self.units.push(u);
                true
            }
            None => {
                self.wants_unit = true;
                false
            }
        }
    }

    /// Bytes that still fit in the packet starting at `off` holding `len`:
    /// packets never cross a block boundary.
    fn packet_room(&self, off: u64, len: usize) -> usize {
        let bs = self.limits.block_size;
        let to_block_end = bs - (off % bs);
        let cap = (self.limits.packet_size as u64).min(to_block_end) as usize;
        cap.saturating_sub(len)
    }

    /// Moves the current packet, if it holds anything, to the data queue.
    fn seal_packet(&mut self) {
        if self.packet.is_empty() {
            return;
        }
        let data = std::mem::take(&mut self.packet);
        let off = self.packet_off;
        self.packet_off = off + data.len() as u64;
        // The first packet in flight is the stream's own; others carry a
        // unit (`may_seal`). A barrier seals a partial packet without
        // asking: it then borrows the stream's guaranteed slot, at most
        // one packet over the budget per stream.
        let unit = if self.in_flight == 0 {
            None
        } else {
            self.units.pop()
        };
        self.data_queue.push_back(Queued {
            job: Job::Packet(Packet { off, data }),
            unit,
        });
        self.in_flight += 1;
        self.peak_in_flight = self.peak_in_flight.max(self.in_flight);
    }

    /// After acks freed room (or a unit came): moves a blocked write's
    /// bytes into packets; returns its completion once all of them are in.
    fn resume_blocked(&mut self, take_unit: TakeUnit<'_>) -> Option<Done> {
        let Some(mut b) = self.blocked.take() else {
            // Seal a packet that filled up while the bound was reached.
            self.copy_in(&[], take_unit);
            return None;
        };
        let n = self.copy_in(&b.rest, take_unit);
        if n == b.rest.len() {
            return Some(b.done);
        }
        b.rest.drain(..n);
        self.blocked = Some(b);
        None
    }

    /// The write buffer handed this stream the unit it queued for: a
    /// blocked write goes on. A unit it no longer needs (its own acks
    /// unblocked it meanwhile, or it failed) goes back at once.
    pub fn unit_granted(&mut self, unit: Unit, take_unit: TakeUnit<'_>) -> Granted {
        self.wants_unit = false;
        self.units.push(unit);
        let done = if self.failed.is_none() {
            self.resume_blocked(take_unit)
        } else {
            None
        };
        let spare = if self.blocked.is_none() {
            std::mem::take(&mut self.units)
        } else {
            Vec::new()
        };
        Granted { done, spare }
    }

    /// Whether the caller must start a streamer: work is queued and none
    /// runs. It then counts as running.
    pub fn claim_streamer(&mut self) -> bool {
        if self.running || self.data_queue.is_empty() {
            return false;
        }
        self.running = true;
        true
    }

    /// The streamer stops here if nothing is queued and the stream has not
    /// failed (a failed stream's queued callbacks are the streamer's to
    /// fail, through [`Self::next_job`]), as [`Self::next_job`] would stop
    /// it on its next call.
    pub fn idle_if_drained(&mut self) -> bool {
        if self.failed.is_none() && self.data_queue.is_empty() {
            self.running = false;
            return true;
        }
        false
    }

    /// Claims the streamer for a close made on the caller's thread: only
    /// when the stream was written since its last close, and everything
    /// written is acknowledged, with nothing buffered, queued, blocked or
    /// failed (then the close has no packet to send; whether it has a
    /// block to finalise is the streamer's to say). Released by
    /// [`Self::release_after_close`].
    pub fn claim_for_close(&mut self) -> bool {
        let quiet = self.dirty
            && self.failed.is_none()
            && !self.running
            && self.packet.is_empty()
            && self.blocked.is_none()
            && self.data_queue.is_empty()
            && self.ack_queue.is_empty()
            && self.acked == self.pos;
        if quiet {
            self.running = true;
        }
        quiet
    }

    /// The close made on the caller's thread is over: true if jobs were
    /// queued meanwhile (the streamer stays claimed, for a worker to
    /// drain them, or to fail them if the close failed), else the
    /// streamer is free again.
    pub fn release_after_close(&mut self) -> bool {
        if self.data_queue.is_empty() {
            self.running = false;
            return false;
        }
        true
    }

    pub fn is_streaming(&self) -> bool {
        self.running
    }

    /// Queues the barrier `kind` (completing `done`) after everything
    /// written so far: completed at once on a failed stream (with its
    /// error), and a flush or close of a stream with nothing to do. An
    /// fsync always runs: through any descriptor it makes durable what the
    /// file's earlier writers, and this stream's closes, left unsynced
    /// (docs/SEMANTICS.md "Durability").
    pub fn barrier(&mut self, kind: Barrier, done: Done) -> Enqueued {
        if let Some(e) = &self.failed {
            return Enqueued::Now(done, Err(e.clone()));
        }
        let idle = !self.dirty && !self.running && self.data_queue.is_empty();
        if idle && kind != Barrier::Sync {
            return Enqueued::Now(done, Ok(()));
        }
        self.seal_packet();
        self.push(kind.job(done));
        Enqueued::Queued
    }

    /// Queues a truncation to `size` after everything written so far; the
    /// stream's end is `size` from now on.
    pub fn truncate(&mut self, size: u64, done: Done, now: i64) -> Enqueued {
        if let Some(e) = &self.failed {
            return Enqueued::Now(done, Err(e.clone()));
        }
        self.seal_packet();
        self.pos = size;
        self.packet_off = size;
        self.dirty = true;
        self.mtime = Some(now);
        self.push(Job::Truncate(size, done));
        Enqueued::Queued
    }

    fn push(&mut self, job: Job) {
        self.data_queue.push_back(Queued { job, unit: None });
    }

    /// The streamer's next job, in order; a packet moves to the ack queue.
    /// On a failed or drained stream the streamer stops (no longer
    /// running).
    pub fn next_job(&mut self) -> Next {
        if let Some(e) = self.failed.clone() {
            let cbs = self.take_callbacks();
            self.running = false;
            return Next::Failed(e, cbs);
        }
        match self.data_queue.pop_front() {
            Some(Queued { job, unit }) => {
                if let Job::Packet(p) = &job {
                    self.ack_queue.push_back(Unacked {
                        end: p.end(),
                        _unit: unit,
                    });
                }
                Next::Job(job)
            }
            None => {
                self.running = false;
                Next::Idle
            }
        }
    }

    /// The close or fsync queued right after the packet the streamer just
    /// took: the streamer may then write the packet whole and close the
    /// file, or make it durable, in one step. The barrier is taken off the
    /// queue; its completion is the caller's. `sync`: an fsync may be
    /// taken too.
    ///
    /// A close only if nothing was written or queued after it (the packet
    /// is the stream's last). An fsync whatever is queued behind it: the
    /// stream stays open after a whole fsync, and what follows (a later
    /// write reopens the block for append, a close records the file
    /// closed) is done in order as on any stream. A close may well be
    /// queued there: a FLUSH comes at every `close()` of a copy of the
    /// descriptor, also the implicit one when a forked child of the
    /// writer's process execs, while the writer's fsync is still waiting
    /// for the worker (the power-cut tests, whose sibling tests fork, saw
    /// it about once in 20 runs).
    pub fn take_ending(&mut self, sync: bool) -> Option<Ending> {
        if !self.packet.is_empty() || self.blocked.is_some() {
            return None;
        }
        let last = self.data_queue.len() == 1;
        match self.data_queue.front().map(|q| &q.job) {
            Some(Job::Close(_)) if last => {}
            Some(Job::Sync(_)) if sync => {}
            _ => return None,
        }
        match self.data_queue.pop_front() {
            Some(Queued {
                job: Job::Close(d), ..
            }) => Some(Ending::Close(d)),
            Some(Queued {
                job: Job::Sync(d), ..
            }) => Some(Ending::Sync(d)),
            Some(q) => {
                self.data_queue.push_front(q);
                None
            }
            None => None,
        }
    }

    /// Appends to `p` (the packet the streamer just took) the packets
    /// queued right behind it that continue it, up to `cap` bytes in all
    /// and never past the end of `block` (the range of the block `p` goes
    /// into), so that a datanode that charges per request writes them as
    /// one. Each keeps its own place in the ack queue; returns the ends
    /// of `p` as taken and of each packet added, in order, for the caller
    /// to acknowledge one by one once the merged write is done. Stops at
    /// the first barrier.
    pub fn merge_following(
        &mut self,
        p: &mut Packet,
        cap: usize,
        block: std::ops::Range<u64>,
    ) -> Vec<u64> {
        let mut ends = vec![p.end()];
        while let Some(Queued {
            job: Job::Packet(next),
            ..
        }) = self.data_queue.front()
        {
            if next.off != p.end() || next.end() > block.end || p.data.len() + next.data.len() > cap
            {
                break;
            }
            let Some(Queued {
                job: Job::Packet(next),
                unit,
            }) = self.data_queue.pop_front()
            else {
                break;
            };
            p.data.extend_from_slice(&next.data);
            ends.push(next.end());
            self.ack_queue.push_back(Unacked {
                end: next.end(),
                _unit: unit,
            });
        }
        ends
    }

    /// Every replica wrote the packet ending at `end` (the oldest
    /// unacknowledged one): it is visible, its unit goes back to the write
    /// buffer, and a blocked write may go on (its completion is returned).
    pub fn ack(&mut self, end: u64, take_unit: TakeUnit<'_>) -> Option<Done> {
        let acked = self.ack_queue.pop_front();
        debug_assert_eq!(
            acked.as_ref().map(|a| a.end),
            Some(end),
            "acknowledgements come in the packets' order"
        );
        self.acked = self.acked.max(end);
        self.in_flight = self.in_flight.saturating_sub(1);
        // Back to the write buffer first: streams that queued for it come
        // before this one's next packet.
        drop(acked);
        self.resume_blocked(take_unit)
    }

    /// A truncation to `size` is done: that is the visible length.
    pub fn truncated(&mut self, size: u64) {
        self.acked = size;
    }

    /// A close is done: the stream is clean again unless more came in
    /// meanwhile (a later close then has nothing left to do).
    pub fn closed(&mut self) {
        if self.data_queue.is_empty() && self.packet.is_empty() && self.blocked.is_none() {
            self.dirty = false;
        }
    }

    /// Fails the stream with `e` (replacing an earlier error).
    pub fn fail(&mut self, e: FsError) {
        self.failed = Some(e);
    }

    /// Fails the stream with `e` unless it failed already; returns the
    /// error it fails with.
    pub fn fail_first(&mut self, e: FsError) -> FsError {
        self.failed.get_or_insert(e).clone()
    }

    /// Everything waiting on a failed stream, to be failed outside the
    /// lock; queued packets are dropped (their units go back).
    pub fn take_callbacks(&mut self) -> Vec<Done> {
        let mut v: Vec<Done> = self.blocked.take().map(|b| b.done).into_iter().collect();
        for q in self.data_queue.drain(..) {
            match q.job {
                Job::Packet(_) => {}
                Job::Flush(d) | Job::Sync(d) | Job::Close(d) | Job::Truncate(_, d) => v.push(d),
            }
        }
        self.ack_queue.clear();
        self.in_flight = 0;
        v
    }

    /// The streamer stopped without finishing (it panicked outside a job).
    pub fn streamer_gone(&mut self) {
        self.running = false;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Weak;

    use super::*;
    use crate::pipeline::budget::{Budget, UnitWaiter};
    use crate::sync::{Arc, Mutex, lock};

    /// Completions that note how they were called.
    #[derive(Clone, Default)]
    struct Calls(Arc<Mutex<Vec<String>>>);

    impl Calls {
        fn done(&self, name: &'static str) -> Done {
            let calls = self.0.clone();
            Box::new(move |r| {
                let what = match r {
                    Ok(()) => "ok".to_string(),
                    Err(e) => e.to_string(),
                };
                lock(&calls).push(format!("{name}: {what}"));
            })
        }

        fn seen(&self) -> Vec<String> {
            std::mem::take(&mut *lock(&self.0))
        }
    }

    fn call(d: Option<Done>, r: FsResult<()>) {
        if let Some(d) = d {
            d(r)
        }
    }

    struct NoWaiter;
    impl UnitWaiter for NoWaiter {
        fn unit_granted(self: Arc<Self>, _: Unit) {}
    }

    /// A write buffer of `units`, and a way to take from it.
    struct Buffer {
        budget: Arc<Budget>,
        waiter: Weak<dyn UnitWaiter>,
        _rt: tokio::runtime::Runtime,
    }

    impl Buffer {
        fn new(units: usize) -> Buffer {
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .expect("runtime");
            Buffer {
                budget: Budget::new(units, rt.handle().clone()),
                waiter: Weak::<NoWaiter>::new(),
                _rt: rt,
            }
        }

        fn take(&self) -> impl FnMut() -> Option<Unit> + '_ {
            || self.budget.take(&self.waiter)
        }
    }

    fn limits(max_in_flight: usize) -> Limits {
        Limits {
            packet_size: 100,
            max_in_flight,
            block_size: 250,
        }
    }

    /// The packets the streamer would take next, as (offset, length),
    /// each acknowledged at once; stops at the first barrier.
    fn take_packets(s: &mut StreamState, buf: &Buffer) -> Vec<(u64, usize)> {
        let mut out = Vec::new();
        while let Next::Job(Job::Packet(p)) = s.next_job() {
            out.push((p.off, p.data.len()));
            call(s.ack(p.end(), &mut buf.take()), Ok(()));
        }
        out
    }

    #[test]
    fn packets_fill_to_the_packet_size_and_never_cross_a_block_boundary() {
        let buf = Buffer::new(100);
        let calls = Calls::default();
        let mut s = StreamState::new(limits(10), 0);
        let now = s.accept(&[7; 600], calls.done("write"), 1, &mut buf.take());
        call(now, Ok(()));
        assert_eq!(calls.seen(), ["write: ok"]);
        assert_eq!((s.pos(), s.in_flight(), s.visible_len()), (600, 7, 0));
        assert!(s.claim_streamer());
        assert!(!s.claim_streamer(), "one streamer at a time");
        assert_eq!(
            take_packets(&mut s, &buf),
            [
                (0, 100),
                (100, 100),
                (200, 50),
                (250, 100),
                (350, 100),
                (450, 50),
                (500, 100)
            ]
        );
        assert_eq!((s.visible_len(), s.in_flight()), (600, 0));
        assert!(
            !s.is_streaming(),
            "the streamer stops when the queue is empty"
        );
    }

    #[test]
    fn only_a_written_stream_with_everything_acknowledged_is_closed_by_its_caller() {
        let buf = Buffer::new(100);
        let calls = Calls::default();
        let mut s = StreamState::new(limits(10), 0);
        assert!(!s.claim_for_close(), "nothing written: nothing to record");
        call(
            s.accept(&[7; 50], calls.done("w"), 1, &mut buf.take()),
            Ok(()),
        );
        assert!(!s.claim_for_close(), "a packet is still buffered");
        assert!(matches!(
            s.barrier(Barrier::Sync, calls.done("sync")),
            Enqueued::Queued
        ));
        assert!(!s.claim_for_close(), "a job is queued");
        assert!(s.claim_streamer());
        let Next::Job(Job::Packet(p)) = s.next_job() else {
            panic!("the packet first")
        };
        assert!(!s.claim_for_close(), "the streamer runs");
        call(s.ack(p.end(), &mut buf.take()), Ok(()));
        let Next::Job(Job::Sync(d)) = s.next_job() else {
            panic!("then the sync")
        };
        d(Ok(()));
        assert!(matches!(s.next_job(), Next::Idle));
        // Everything acknowledged, nothing queued: the close is the caller's.
        assert!(s.claim_for_close());
        assert!(s.is_streaming(), "a write meanwhile waits for the close");
        assert!(!s.claim_streamer());
        assert!(!s.release_after_close());
        assert!(!s.is_streaming());
        // A write queued while the caller closed starts a worker after it.
        assert!(s.claim_for_close());
        call(
            s.accept(&[8; 50], calls.done("w2"), 2, &mut buf.take()),
            Ok(()),
        );
        assert!(matches!(
            s.barrier(Barrier::Flush, calls.done("flush")),
            Enqueued::Queued
        ));
        assert!(s.release_after_close(), "the streamer stays claimed");
        assert!(s.is_streaming());
        assert_eq!(calls.seen(), ["w: ok", "sync: ok", "w2: ok"]);
    }

    #[test]
    fn queued_packets_that_continue_one_merge_up_to_the_cap_and_the_block_end_and_each_is_acknowledged()
     {
        let buf = Buffer::new(100);
        let calls = Calls::default();
        let mut s = StreamState::new(limits(10), 0);
        call(
            s.accept(&[7; 450], calls.done("w1"), 1, &mut buf.take()),
            Ok(()),
        );
        assert!(matches!(
            s.barrier(Barrier::Flush, calls.done("flush")),
            Enqueued::Queued
        ));
        call(
            s.accept(&[8; 50], calls.done("w2"), 2, &mut buf.take()),
            Ok(()),
        );
        assert!(s.claim_streamer());
        let Next::Job(Job::Packet(mut p)) = s.next_job() else {
            panic!("a packet first")
        };
        // Capped at 200 bytes: the first two packets.
        assert_eq!(s.merge_following(&mut p, 200, 0..250), [100, 200]);
        assert_eq!((p.off, p.data.len()), (0, 200));
        for end in [100, 200] {
            call(s.ack(end, &mut buf.take()), Ok(()));
        }
        assert_eq!(s.visible_len(), 200);
        // The block ends at 250: the packet up to it, not the one after.
        let Next::Job(Job::Packet(mut p)) = s.next_job() else {
            panic!("the block's last packet")
        };
        assert_eq!(s.merge_following(&mut p, 1 << 20, 0..250), [250]);
        call(s.ack(250, &mut buf.take()), Ok(()));
        // The next block's packets merge up to the barrier, never past it.
        let Next::Job(Job::Packet(mut p)) = s.next_job() else {
            panic!("the next block")
        };
        assert_eq!(s.merge_following(&mut p, 1 << 20, 250..500), [350, 450]);
        assert!(matches!(s.next_job(), Next::Job(Job::Flush(_))));
        assert_eq!(s.in_flight(), 2 + 1, "one more packet behind the barrier");
    }

    #[test]
    fn a_merging_block_lets_twice_the_bound_in_flight() {
        let buf = Buffer::new(100);
        let calls = Calls::default();
        let big = Limits {
            block_size: 1 << 20,
            ..limits(2)
        };
        let mut s = StreamState::new(big, 0);
        assert!(
            s.accept(&[1; 450], calls.done("w"), 1, &mut buf.take())
                .is_none()
        );
        assert_eq!((s.in_flight(), s.in_flight_bound()), (2, 2));
        let mut s = StreamState::new(big, 0);
        assert!(s.set_merging(true, &mut buf.take()).is_none());
        assert!(
            s.accept(&[1; 450], calls.done("w"), 1, &mut buf.take())
                .is_some()
        );
        assert_eq!((s.in_flight(), s.in_flight_bound()), (4, 4));
    }

    #[test]
    fn a_write_past_the_in_flight_bound_waits_for_acks_in_order() {
        let buf = Buffer::new(100);
        let calls = Calls::default();
        let mut s = StreamState::new(
            Limits {
                block_size: 1 << 20,
                ..limits(2)
            },
            1000,
        );
        // Two packets in flight, a third full one waiting, 150 bytes
        // still to come: the write is blocked.
        let now = s.accept(&[1; 450], calls.done("write"), 1, &mut buf.take());
        assert!(now.is_none());
        assert_eq!((s.pos(), s.in_flight()), (1300, 2));
        let Next::Job(Job::Packet(p)) = s.next_job() else {
            panic!("a packet first")
        };
        assert_eq!((p.off, p.end()), (1000, 1100));
        // Acknowledged in order: each ack moves the visible length and
        // lets one more packet in, until the write's bytes are all in.
        assert!(s.ack(p.end(), &mut buf.take()).is_none());
        assert_eq!((s.visible_len(), s.in_flight(), s.pos()), (1100, 2, 1400));
        let Next::Job(Job::Packet(p)) = s.next_job() else {
            panic!("the second packet")
        };
        assert_eq!(p.off, 1100);
        call(s.ack(p.end(), &mut buf.take()), Ok(()));
        assert_eq!(calls.seen(), ["write: ok"]);
        assert_eq!((s.visible_len(), s.pos()), (1200, 1450));
        assert!(s.peak_in_flight() <= 2);
        // The last 50 bytes wait in the current packet for more, or a
        // barrier.
        assert_eq!(take_packets(&mut s, &buf), [(1200, 100), (1300, 100)]);
        assert_eq!(s.visible_len(), 1400);
    }

    #[test]
    fn a_barrier_waits_behind_the_packets_before_it() {
        let buf = Buffer::new(100);
        let calls = Calls::default();
        let mut s = StreamState::new(limits(10), 0);
        // Nothing written: nothing to wait for.
        for kind in [Barrier::Flush, Barrier::Close] {
            match s.barrier(kind, calls.done("idle")) {
                Enqueued::Now(d, r) => d(r),
                Enqueued::Queued => panic!("an untouched stream queued a {kind:?}"),
            }
        }
        assert_eq!(calls.seen(), ["idle: ok", "idle: ok"]);
        // An fsync always runs: there may be blocks earlier writers left
        // unsynced.
        assert!(matches!(
            s.barrier(Barrier::Sync, calls.done("idle sync")),
            Enqueued::Queued
        ));
        assert!(matches!(s.next_job(), Next::Job(Job::Sync(_))));
        call(
            s.accept(&[2; 150], calls.done("write"), 1, &mut buf.take()),
            Ok(()),
        );
        // The barrier seals the partial packet and waits behind it.
        assert!(matches!(
            s.barrier(Barrier::Sync, calls.done("sync")),
            Enqueued::Queued
        ));
        assert_eq!(take_packets(&mut s, &buf), [(0, 100), (100, 50)]);
        // (`take_packets` stopped at the barrier and took it.)
        assert_eq!(calls.seen(), ["write: ok"]);
        assert!(matches!(s.next_job(), Next::Idle));
    }

    // The one-step endings: a close only behind the stream's last packet
    // with nothing after it; an fsync also with a close behind it (a
    // forked child's exec closes its copy of the descriptor: FLUSH).
    #[test]
    fn an_fsync_is_taken_with_its_packet_whatever_follows_it_and_a_close_only_last() {
        let buf = Buffer::new(100);
        let calls = Calls::default();
        // One packet queued, then two barriers behind it; the packet taken.
        let behind_a_packet = |first: Barrier, second: Barrier| {
            let mut s = StreamState::new(limits(8), 0);
            call(
                s.accept(&[1; 50], calls.done("write"), 1, &mut buf.take()),
                Ok(()),
            );
            s.barrier(first, calls.done("first"));
            s.barrier(second, calls.done("second"));
            assert!(matches!(s.next_job(), Next::Job(Job::Packet(_))));
            s
        };
        let mut s = behind_a_packet(Barrier::Sync, Barrier::Close);
        assert!(s.take_ending(false).is_none(), "no fsync asked for");
        assert!(matches!(s.take_ending(true), Some(Ending::Sync(_))));
        assert!(matches!(s.next_job(), Next::Job(Job::Close(_))));
        // A close with anything behind it is not the stream's last.
        let mut s = behind_a_packet(Barrier::Close, Barrier::Flush);
        assert!(s.take_ending(true).is_none());
        assert!(matches!(s.next_job(), Next::Job(Job::Close(_))));
    }

    #[test]
    fn a_failed_stream_fails_every_waiter_and_every_later_call() {
        let buf = Buffer::new(100);
        let calls = Calls::default();
        let mut s = StreamState::new(limits(1), 0);
        assert!(
            s.accept(&[3; 300], calls.done("write"), 1, &mut buf.take())
                .is_none()
        );
        assert!(matches!(
            s.barrier(Barrier::Close, calls.done("close")),
            Enqueued::Queued
        ));
        s.fail(FsError::Io("every replica failed".into()));
        let Next::Failed(e, cbs) = s.next_job() else {
            panic!("a failed stream runs nothing")
        };
        for d in cbs {
            d(Err(e.clone()));
        }
        assert_eq!(
            calls.seen(),
            [
                "write: i/o error: every replica failed",
                "close: i/o error: every replica failed"
            ]
        );
        assert_eq!(s.in_flight(), 0);
        assert!(matches!(s.check_write(None), Err(FsError::Io(_))));
        assert!(matches!(
            s.barrier(Barrier::Flush, calls.done("flush")),
            Enqueued::Now(_, Err(FsError::Io(_)))
        ));
        // The first error stays the stream's.
        let kept = s.fail_first(FsError::BadHandle);
        assert!(matches!(kept, FsError::Io(_)), "{kept}");
    }

    #[test]
    fn without_a_unit_of_the_write_buffer_only_the_first_packet_goes_in_flight() {
        let buf = Buffer::new(1);
        let calls = Calls::default();
        let other = buf.budget.take(&buf.waiter).expect("the only unit");
        let mut s = StreamState::new(limits(10), 0);
        assert!(
            s.accept(&[4; 250], calls.done("write"), 1, &mut buf.take())
                .is_none(),
            "the second packet needs a unit another stream holds"
        );
        assert_eq!((s.in_flight(), s.pos()), (1, 200));
        assert_eq!(buf.budget.stats().waiting, 1);
        // The unit comes: the write goes on, and what it does not need
        // goes back.
        let g = s.unit_granted(other, &mut buf.take());
        call(g.done, Ok(()));
        assert_eq!(calls.seen(), ["write: ok"]);
        assert_eq!((s.in_flight(), s.pos()), (2, 250));
        assert!(g.spare.is_empty());
    }

    #[test]
    fn writes_must_continue_the_stream_and_truncation_moves_its_end() {
        let buf = Buffer::new(10);
        let calls = Calls::default();
        let mut s = StreamState::new(limits(10), 500);
        s.check_write(Some(500)).unwrap();
        s.check_write(None).unwrap();
        match s.check_write(Some(10)) {
            Err(FsError::OutOfOrderWrite { expected, got }) => {
                assert_eq!((expected, got), (500, 10))
            }
            r => panic!("{r:?}"),
        }
        call(
            s.accept(&[5; 50], calls.done("write"), 1, &mut buf.take()),
            Ok(()),
        );
        assert!(matches!(
            s.truncate(20, calls.done("truncate"), 2),
            Enqueued::Queued
        ));
        assert_eq!((s.pos(), s.mtime()), (20, Some(2)));
        s.check_write(Some(20)).unwrap();
        assert_eq!(take_packets(&mut s, &buf), [(500, 50)]);
        s.truncated(20);
        assert_eq!(s.visible_len(), 20);
        // A close with nothing after it leaves the stream clean.
        assert!(s.is_dirty());
        s.closed();
        assert!(!s.is_dirty());
    }
}
