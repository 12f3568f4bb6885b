//! [`OutputStream`]: the writer's side of one file under construction.
//!
//! `write()` only copies into the current packet; full packets join the
//! data queue and a worker on the blocking pool streams them to the
//! replicas (see `streamer`). Nothing here blocks the caller: a write that
//! finds the in-flight bound reached, a flush, an fsync and a close hand
//! their completion callback to the stream, and the worker calls it once
//! the acks (and syncs) are in. Callbacks are never called under a lock.

use std::collections::VecDeque;

use crate::error::{FsError, FsResult};
use crate::meta::{Meta, UnderConstruction, now_ns};
use crate::pipeline::Datanodes;
use crate::pipeline::budget::{Budget, Unit};
use crate::sync::{Arc, Condvar, Mutex, lock};

/// Completion of a deferred operation.
pub type Done = Box<dyn FnOnce(FsResult<()>) + Send>;

/// What every stream of a mount shares.
pub struct StreamCtx {
    pub meta: Arc<dyn Meta>,
    pub dns: Arc<Datanodes>,
    pub rt: tokio::runtime::Handle,
    pub packet_size: usize,
    pub max_in_flight: usize,
    /// Record the visible length in the store at every flush and fsync,
    /// for readers on other daemons sharing the namespace.
    pub publish_lengths: bool,
    /// One `syncfs` per filesystem at fsync (`replica_sync=fs`).
    pub sync_by_fs: bool,
    /// Replicas found bad (reads, syncs), for housekeeping to repair.
    pub bad: Arc<crate::pipeline::reader::BadReplicas>,
    /// Files whose every block was synced by an fsync since the daemon
    /// started, with nothing changed since but through a live stream (which
    /// tracks its own changes): their fsync syncs only the stream's part.
    pub synced_files: Mutex<std::collections::HashSet<u64>>,
    /// The mount's write buffer, shared by every stream.
    pub budget: Arc<Budget>,
    /// The mount's statistics (`leasefs stats`).
    pub metrics: Arc<crate::metrics::Metrics>,
}

pub(crate) struct Packet {
    pub off: u64,
    pub data: Vec<u8>,
    /// Its share of the write buffer (none for a stream's only packet in
    /// flight); given back when the packet is dropped.
    pub unit: Option<Unit>,
}

/// Ordered work for the worker: packets, and barriers that complete once
/// everything before them is acknowledged.
pub(crate) enum Job {
    Packet(Packet),
    Flush(Done),
    Sync(Done),
    Close(Done),
    Truncate(u64, Done),
}

pub(crate) struct BlockedWrite {
    pub rest: Vec<u8>,
    pub done: Done,
}

pub(crate) struct State {
    /// Bytes accepted from the writer: where the next write must start.
    pub pos: u64,
    /// Bytes acknowledged by every replica: the visible length.
    pub acked: u64,
    pub cur: Vec<u8>,
    pub cur_off: u64,
    pub jobs: VecDeque<Job>,
    pub in_flight: usize,
    pub peak_in_flight: usize,
    /// Units of the write buffer handed to this stream and not yet used.
    pub units: Vec<Unit>,
    /// Queued for a unit of the write buffer.
    pub wants_unit: bool,
    pub running: bool,
    /// A write that found the in-flight bound reached: the bytes not yet
    /// in packets, and its completion (replied once all are in packets).
    pub blocked: Option<BlockedWrite>,
    pub failed: Option<FsError>,
    pub mtime: Option<i64>,
    /// Anything written or truncated through this stream yet: an untouched
    /// stream flushes and closes without any work.
    pub dirty: bool,
}

pub struct OutputStream {
    pub ino: u64,
    pub block_size: u64,
    pub(crate) ctx: Arc<StreamCtx>,
    /// Persisted (once) on the first change to the file.
    pub(crate) uc: UnderConstruction,
    pub(crate) st: Mutex<State>,
    pub(crate) idle: Condvar,
    /// The worker's pipeline of the current block; only the worker (one at
    /// a time, `running`) touches it.
    pub(crate) pipe: Mutex<super::streamer::Pipe>,
    /// Itself, for the write buffer's queue of waiting streams.
    me: std::sync::Weak<OutputStream>,
}

/// A snapshot for xattrs and tests.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct StreamStats {
    pub pos: u64,
    pub acked: u64,
    pub in_flight: usize,
    pub peak_in_flight: usize,
    pub max_in_flight: usize,
}

impl OutputStream {
    /// A stream positioned at the end of a file of `size` bytes.
    pub fn new(
        ctx: Arc<StreamCtx>,
        ino: u64,
        size: u64,
        block_size: u64,
        uc: UnderConstruction,
    ) -> Arc<OutputStream> {
        Arc::new_cyclic(|me| OutputStream {
            me: me.clone(),
            ino,
            block_size,
            uc,
            st: Mutex::new(State {
                pos: size,
                acked: size,
                cur: Vec::new(),
                cur_off: size,
                jobs: VecDeque::new(),
                in_flight: 0,
                peak_in_flight: 0,
                units: Vec::new(),
                wants_unit: false,
                running: false,
                blocked: None,
                failed: None,
                mtime: None,
                dirty: false,
            }),
            idle: Condvar::new(),
            pipe: Mutex::new(super::streamer::Pipe::new(size, block_size)),
            ctx,
        })
    }

    pub fn visible_len(&self) -> u64 {
        lock(&self.st).acked
    }

    /// Where the next write must start.
    pub fn pos(&self) -> u64 {
        lock(&self.st).pos
    }

    pub fn mtime(&self) -> Option<i64> {
        lock(&self.st).mtime
    }

    pub fn stats(&self) -> StreamStats {
        let s = lock(&self.st);
        StreamStats {
            pos: s.pos,
            acked: s.acked,
            in_flight: s.in_flight,
            peak_in_flight: s.peak_in_flight,
            max_in_flight: self.ctx.max_in_flight,
        }
    }

    /// Appends `data`. `offset` is checked against the stream's end unless
    /// it is `None` (O_APPEND: always the real end). `done` is called at
    /// once, or when acks have brought the in-flight packets under the bound.
    pub fn write(self: &Arc<Self>, offset: Option<u64>, data: &[u8], done: Done) {
        let mut s = lock(&self.st);
        if let Some(e) = &s.failed {
            let e = e.clone();
            drop(s);
            return done(Err(e));
        }
        if let Some(off) = offset
            && off != s.pos
        {
            let e = FsError::OutOfOrderWrite {
                expected: s.pos,
                got: off,
            };
            tracing::warn!(ino = self.ino, "refused write: {e}");
            drop(s);
            return done(Err(e));
        }
        self.ctx.metrics.written(data.len() as u64);
        let taken = self.copy_in(&mut s, data);
        s.mtime = Some(now_ns());
        s.dirty = true;
        let now = if taken == data.len() {
            Some(done)
        } else {
            // The kernel sends one write of a file at a time (it holds the
            // inode lock), so at most one write is ever blocked here.
            s.blocked = Some(BlockedWrite {
                rest: data[taken..].to_vec(),
                done,
            });
            None
        };
        let start = self.ensure_running(&mut s);
        drop(s);
        if start {
            self.spawn_worker();
        }
        if let Some(done) = now {
            done(Ok(()))
        }
    }

    /// Copies as much of `data` into packets as the in-flight bound and
    /// the write buffer allow; returns how many bytes it took. A full
    /// packet is sealed only while fewer than `max_packets_in_flight` are
    /// unacknowledged, and, unless it is the stream's only one in flight,
    /// with a unit of the write buffer.
    fn copy_in(&self, s: &mut State, data: &[u8]) -> usize {
        let mut taken = 0;
        loop {
            if !s.cur.is_empty() && self.packet_room(s.cur_off, s.cur.len()) == 0 {
                if s.in_flight >= self.ctx.max_in_flight || !self.may_seal(s) {
                    return taken;
                }
                self.seal_packet(s);
            }
            if taken == data.len() {
                return taken;
            }
            if s.cur.is_empty() {
                s.cur_off = s.pos;
                if s.cur.capacity() == 0 {
                    s.cur.reserve_exact(self.ctx.packet_size);
                }
            }
            let room = self.packet_room(s.cur_off, s.cur.len());
            let take = room.min(data.len() - taken);
            s.cur.extend_from_slice(&data[taken..taken + take]);
            s.pos += take as u64;
            taken += take;
        }
    }

    /// Whether a full packet may go in flight now: the stream's first one
    /// always; any other with a unit of the write buffer, taken now or
    /// handed over earlier. Without one the stream queues for it (once).
    fn may_seal(&self, s: &mut State) -> bool {
        if s.in_flight == 0 || !s.units.is_empty() {
            return true;
        }
        if s.wants_unit {
            return false;
        }
        match self.ctx.budget.take(&self.me) {
            Some(u) => {
                s.units.push(u);
                true
            }
            None => {
                s.wants_unit = true;
                false
            }
        }
    }

    /// The write buffer handed this stream the unit it queued for: a
    /// blocked write goes on. A unit it no longer needs (its own acks
    /// unblocked it meanwhile, or it failed) goes back at once.
    pub(crate) fn unit_granted(self: Arc<Self>, unit: Unit) {
        let mut s = lock(&self.st);
        s.wants_unit = false;
        s.units.push(unit);
        let done = if s.failed.is_none() {
            self.resume_blocked(&mut s)
        } else {
            None
        };
        let spare = if s.blocked.is_none() {
            std::mem::take(&mut s.units)
        } else {
            Vec::new()
        };
        let start = self.ensure_running(&mut s);
        drop(s);
        drop(spare);
        if start {
            self.spawn_worker();
        }
        if let Some(done) = done {
            done(Ok(()))
        }
    }

    /// After acks freed room: moves a blocked write's bytes into packets;
    /// returns its completion once all of them are in.
    pub(crate) fn resume_blocked(&self, s: &mut State) -> Option<Done> {
        let Some(mut b) = s.blocked.take() else {
            // Seal a packet that filled up while the bound was reached.
            self.copy_in(s, &[]);
            return None;
        };
        let n = self.copy_in(s, &b.rest);
        if n == b.rest.len() {
            return Some(b.done);
        }
        b.rest.drain(..n);
        s.blocked = Some(b);
        None
    }

    /// Bytes that still fit in the packet starting at `off` holding `len`:
    /// packets never cross a block boundary.
    fn packet_room(&self, off: u64, len: usize) -> usize {
        let to_block_end = self.block_size - (off % self.block_size);
        let cap = (self.ctx.packet_size as u64).min(to_block_end) as usize;
        cap.saturating_sub(len)
    }

    fn seal_packet(&self, s: &mut State) {
        if s.cur.is_empty() {
            return;
        }
        let data = std::mem::take(&mut s.cur);
        let off = s.cur_off;
        s.cur_off = off + data.len() as u64;
        // The first packet in flight is the stream's own; others carry a
        // unit (`may_seal`). A barrier seals a partial packet without
        // asking: it then borrows the stream's guaranteed slot, at most
        // one packet over the budget per stream.
        let unit = if s.in_flight == 0 {
            None
        } else {
            s.units.pop()
        };
        s.jobs.push_back(Job::Packet(Packet { off, data, unit }));
        s.in_flight += 1;
        s.peak_in_flight = s.peak_in_flight.max(s.in_flight);
    }

    /// Returns true when the caller must spawn a worker.
    fn ensure_running(&self, s: &mut State) -> bool {
        if s.running || s.jobs.is_empty() {
            return false;
        }
        s.running = true;
        true
    }

    /// Runs one job's work with a panic contained to the stream: the job
    /// gets `EIO` and the stream is failed, so its other waiters get the
    /// same error at the loop's next turn instead of waiting forever (the
    /// writer's release then closes the file by lease recovery).
    pub(crate) fn contained(&self, f: impl FnOnce() -> FsResult<()>) -> FsResult<()> {
        crate::fault::catch(f).unwrap_or_else(|why| {
            let e = FsError::Io(format!("stream worker panicked: {why}"));
            lock(&self.st).failed.get_or_insert_with(|| e.clone());
            Err(e)
        })
    }

    /// The worker ended by a panic outside a job's work (in a completion
    /// callback): fail the stream and everything still waiting on it, and
    /// mark the worker stopped so that `abort` and later barriers do not
    /// wait for it.
    pub(crate) fn worker_died(&self, why: &str) {
        let mut s = lock(&self.st);
        let e = s
            .failed
            .get_or_insert_with(|| FsError::Io(format!("stream worker panicked: {why}")))
            .clone();
        let cbs = super::streamer::take_callbacks(&mut s);
        s.running = false;
        self.idle.notify_all();
        drop(s);
        lock(&self.pipe).reset();
        for d in cbs {
            d(Err(e.clone()));
        }
    }

    pub(crate) fn spawn_worker(self: &Arc<Self>) {
        let me = self.clone();
        self.ctx.rt.spawn_blocking(move || {
            if let Err(why) = crate::fault::catch(|| me.clone().drain()) {
                me.worker_died(&why);
            }
        });
    }

    fn barrier(self: &Arc<Self>, job: impl FnOnce(Done) -> Job, done: Done) {
        let mut s = lock(&self.st);
        if let Some(e) = &s.failed {
            let e = e.clone();
            drop(s);
            return done(Err(e));
        }
        if !s.dirty && !s.running && s.jobs.is_empty() {
            drop(s);
            return done(Ok(()));
        }
        self.seal_packet(&mut s);
        s.jobs.push_back(job(done));
        let start = self.ensure_running(&mut s);
        drop(s);
        if start {
            self.spawn_worker();
        }
    }

    /// hflush: every byte written so far is acknowledged by every replica
    /// (and so visible to readers) before `done`.
    pub fn flush(self: &Arc<Self>, done: Done) {
        self.barrier(Job::Flush, done)
    }

    /// hsync: as flush, then data, checksums and metadata are durable.
    pub fn sync(self: &Arc<Self>, done: Done) {
        self.barrier(Job::Sync, done)
    }

    /// Flushes, finalises the last block and records the file closed (its
    /// length, blocks, and the end of its time under construction). The
    /// stream stays usable; a close with nothing written since the last
    /// one does nothing.
    pub fn close(self: &Arc<Self>, done: Done) {
        self.barrier(Job::Close, done)
    }

    /// Shrinks (or grows with zeros) the file after everything before it.
    pub fn truncate(self: &Arc<Self>, size: u64, done: Done) {
        let mut s = lock(&self.st);
        if let Some(e) = &s.failed {
            let e = e.clone();
            drop(s);
            return done(Err(e));
        }
        self.seal_packet(&mut s);
        s.pos = size;
        s.cur_off = size;
        s.dirty = true;
        s.mtime = Some(now_ns());
        s.jobs.push_back(Job::Truncate(size, done));
        let start = self.ensure_running(&mut s);
        drop(s);
        if start {
            self.spawn_worker();
        }
    }

    /// Fences the stream (its lease was preempted): every queued and later
    /// operation fails with `err`, and this returns once the worker is idle
    /// so that recovery may touch the replicas.
    pub fn abort(&self, err: FsError) {
        let mut s = lock(&self.st);
        if s.failed.is_none() {
            s.failed = Some(err);
        }
        let mut failed = Vec::new();
        if !s.running {
            failed = super::streamer::take_callbacks(&mut s);
        }
        while s.running {
            s = self.idle.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        let e = s.failed.clone();
        drop(s);
        for d in failed {
            d(Err(e.clone().unwrap_or(FsError::BadHandle)));
        }
        // The worker is idle: drop the replica files it had open.
        lock(&self.pipe).reset();
    }

    /// Sets the file's modification time while a writer has it (utimensat
    /// after writing: tar, rsync, cp -p) and runs `record` under the same
    /// lock, so that the close, which records the stream's time, can neither
    /// overwrite it nor be overwritten by an older value.
    pub fn set_mtime<R>(&self, mtime: i64, record: impl FnOnce() -> R) -> R {
        let mut s = lock(&self.st);
        s.mtime = Some(mtime);
        record()
    }

    /// Written or truncated through at all.
    pub fn is_dirty(&self) -> bool {
        lock(&self.st).dirty
    }

    pub fn is_failed(&self) -> Option<FsError> {
        lock(&self.st).failed.clone()
    }
}
