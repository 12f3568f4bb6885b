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
    /// A close only if nothing was written or queued after it but other
    /// closes (the packet is the stream's last): those complete with it,
    /// as they would find nothing left to do. A FLUSH comes at every
    /// `close()` of a copy of the descriptor: a forked child's exec may
    /// close its copy (a close that seals the packet) a moment before the
    /// writer closes its own, both queued before the worker looks (the
    /// power-cut test of small files closed whole saw it once in some 30
    /// runs). An fsync whatever is queued behind it: the
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
        let only_closes = self
            .data_queue
            .iter()
            .all(|q| matches!(q.job, Job::Close(_)));
        match self.data_queue.front().map(|q| &q.job) {
            Some(Job::Close(_)) if only_closes => {}
            Some(Job::Sync(_)) if sync => {}
            _ => return None,
        }
        match self.data_queue.pop_front() {
            Some(Queued {
                job: Job::Close(d), ..
            }) => {
                let mut all = vec![d];
                while let Some(Queued {
                    job: Job::Close(d), ..
                }) = self.data_queue.pop_front()
                {
                    all.push(d);
                }
                Some(Ending::Close(Box::new(move |r: FsResult<()>| {
                    for d in all {
                        d(r.clone());
                    }
                })))
            }
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
mod tests;
