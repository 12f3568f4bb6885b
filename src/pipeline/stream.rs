//! [`OutputStream`]: the writer's side of one file under construction,
//! shared by its descriptors and their requests.
//!
//! The stream's bookkeeping is a [`StreamState`] under one lock; its I/O
//! is a [`DataStreamer`] that a worker on the blocking pool runs, one job
//! at a time, while jobs are queued (at most one worker per stream).
//! Nothing here blocks the caller: a write that finds the in-flight bound
//! reached, a flush, an fsync and a close hand their completion callback
//! to the stream, and the worker calls it once the acks (and syncs) are
//! in. Callbacks are never called under a lock.

use std::sync::Weak;

use super::budget::{Unit, UnitWaiter};
use super::ctx::{Done, StreamCtx, StreamFile};
use super::outcome::FileLog;
use super::state::{Barrier, Ending, Enqueued, Job, Limits, Next, Packet, StreamState};
use super::streamer::DataStreamer;
use crate::error::{FsError, FsResult};
use crate::meta::now_ns;
use crate::sync::{Arc, Condvar, Mutex, lock};

pub struct OutputStream {
    pub ino: u64,
    /// The writer's user, for the log (its lines are rate-limited per user).
    uid: u32,
    pub block_size: u64,
    ctx: Arc<StreamCtx>,
    st: Mutex<StreamState>,
    /// Signalled when the worker stops.
    idle: Condvar,
    /// Only the running worker (one at a time) touches it.
    streamer: Mutex<DataStreamer>,
    /// Itself, for the write buffer's queue of waiting streams.
    me: Weak<dyn UnitWaiter>,
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
    /// A stream positioned at the end of file `ino`, `size` bytes long in
    /// blocks of `block_size`; what it does to the file is recorded by
    /// `log`.
    pub fn new(
        ctx: Arc<StreamCtx>,
        ino: u64,
        size: u64,
        block_size: u64,
        log: Arc<dyn FileLog>,
        uid: u32,
    ) -> Arc<OutputStream> {
        let limits = Limits {
            packet_size: ctx.packet_size,
            max_in_flight: ctx.max_in_flight,
            block_size,
        };
        let file = StreamFile {
            ino,
            block_size,
            ctx: ctx.clone(),
            log,
        };
        Arc::new_cyclic(|me: &Weak<OutputStream>| OutputStream {
            me: me.clone(),
            ino,
            uid,
            block_size,
            st: Mutex::new(StreamState::new(limits, size)),
            idle: Condvar::new(),
            streamer: Mutex::new(DataStreamer::new(file, size)),
            ctx,
        })
    }

    pub fn visible_len(&self) -> u64 {
        lock(&self.st).visible_len()
    }

    /// Where the next write must start.
    pub fn pos(&self) -> u64 {
        lock(&self.st).pos()
    }

    pub fn mtime(&self) -> Option<i64> {
        lock(&self.st).mtime()
    }

    pub fn stats(&self) -> StreamStats {
        let s = lock(&self.st);
        StreamStats {
            pos: s.pos(),
            acked: s.visible_len(),
            in_flight: s.in_flight(),
            peak_in_flight: s.peak_in_flight(),
            max_in_flight: s.in_flight_bound(),
        }
    }

    /// A unit of the write buffer for this stream, or its place in the
    /// buffer's queue.
    fn take_unit(&self) -> Option<Unit> {
        self.ctx.budget.take(&self.me)
    }

    /// Appends `data`. `offset` is checked against the stream's end unless
    /// it is `None` (O_APPEND: always the real end). `done` is called at
    /// once, or when acks have brought the in-flight packets under the bound.
    pub fn write(self: &Arc<Self>, offset: Option<u64>, data: &[u8], done: Done) {
        let mut s = lock(&self.st);
        if let Err(e) = s.check_write(offset) {
            if matches!(e, FsError::OutOfOrderWrite { .. }) {
                tracing::warn!(ino = self.ino, uid = self.uid, "refused write: {e}");
            }
            drop(s);
            return done(Err(e));
        }
        self.ctx.metrics.written(data.len() as u64);
        let now = s.accept(data, done, now_ns(), &mut || self.take_unit());
        let start = s.claim_streamer();
        drop(s);
        if start {
            self.spawn_worker();
        }
        if let Some(done) = now {
            done(Ok(()))
        }
    }

    /// Runs one job's work with a panic contained to the stream: the job
    /// gets `EIO` and the stream is failed, so its other waiters get the
    /// same error at the loop's next turn instead of waiting forever (the
    /// writer's release then closes the file by lease recovery).
    fn contained(&self, f: impl FnOnce() -> FsResult<()>) -> FsResult<()> {
        crate::fault::catch(f).unwrap_or_else(|why| {
            let e = FsError::Io(format!("stream worker panicked: {why}"));
            lock(&self.st).fail_first(e.clone());
            Err(e)
        })
    }

    /// The worker ended by a panic outside a job's work (in a completion
    /// callback): fail the stream and everything still waiting on it, and
    /// mark the worker stopped so that `abort` and later barriers do not
    /// wait for it.
    fn worker_died(&self, why: &str) {
        let mut s = lock(&self.st);
        let e = s.fail_first(FsError::Io(format!("stream worker panicked: {why}")));
        let cbs = s.take_callbacks();
        s.streamer_gone();
        self.idle.notify_all();
        drop(s);
        lock(&self.streamer).reset();
        for d in cbs {
            d(Err(e.clone()));
        }
    }

    fn spawn_worker(self: &Arc<Self>) {
        let me = self.clone();
        self.ctx.rt.spawn_blocking(move || {
            if let Err(why) = crate::fault::catch(|| me.clone().drain()) {
                me.worker_died(&why);
            }
        });
    }

    /// The worker: drains the data queue, one job at a time, through the
    /// streamer; exactly one runs per stream.
    fn drain(self: Arc<Self>) {
        let mut streamer = lock(&self.streamer);
        loop {
            let merge = streamer.merge_into();
            let grew = lock(&self.st).set_merging(merge.is_some(), &mut || self.take_unit());
            if let Some(d) = grew {
                d(Ok(()));
            }
            let mut ends = Vec::new();
            let job = {
                let mut s = lock(&self.st);
                match s.next_job() {
                    Next::Job(Job::Packet(p)) if streamer.takes_whole(&p) => {
                        match s.take_ending(streamer.syncs_whole()) {
                            Some(Ending::Close(d)) => {
                                drop(s);
                                self.send_whole(&mut streamer, p, d);
                                continue;
                            }
                            Some(Ending::Sync(d)) => {
                                drop(s);
                                let (r, idle) = self.sync_whole(&mut streamer, p);
                                if idle {
                                    drop(streamer);
                                    return d(r);
                                }
                                d(r);
                                continue;
                            }
                            None => Job::Packet(p),
                        }
                    }
                    Next::Job(Job::Packet(mut p)) => {
                        if let Some((block, cap)) = &merge
                            && block.contains(&p.off)
                        {
                            ends = s.merge_following(&mut p, *cap, block.clone());
                        }
                        Job::Packet(p)
                    }
                    Next::Job(j) => j,
                    Next::Idle => {
                        self.idle.notify_all();
                        return;
                    }
                    Next::Failed(e, cbs) => {
                        self.idle.notify_all();
                        drop(s);
                        for d in cbs {
                            d(Err(e.clone()));
                        }
                        return;
                    }
                }
            };
            match job {
                Job::Packet(p) => self.send(&mut streamer, p, &ends),
                Job::Flush(d) => d(self.contained(|| self.publish_length(&streamer))),
                Job::Sync(d) => {
                    // A failed sync is final: the stream is done (its
                    // replicas may have lost what the failed sync was to
                    // make durable, and a later sync would find nothing
                    // left to write and succeed).
                    let r = self
                        .contained(|| self.publish_length(&streamer))
                        .and_then(|()| {
                            let r = self.contained(|| streamer.sync());
                            if let Err(e) = &r {
                                tracing::error!(ino = self.ino, "fsync failed: {e}");
                                lock(&self.st).fail_first(e.clone());
                            }
                            r
                        });
                    let ok = r.is_ok();
                    d(r);
                    if ok {
                        let _ = self.contained(|| {
                            streamer.after_sync();
                            Ok(())
                        });
                    }
                }
                Job::Close(d) => {
                    let r = self.contained(|| self.close_now(&mut streamer));
                    self.closed(r, None, d)
                }
                Job::Truncate(size, d) => {
                    let mtime = || lock(&self.st).mtime().unwrap_or_else(now_ns);
                    let r = self.contained(|| streamer.truncate(size, &mtime));
                    let mut s = lock(&self.st);
                    match &r {
                        Ok(()) => s.truncated(size),
                        Err(e) => s.fail(e.clone()),
                    }
                    drop(s);
                    d(r)
                }
            }
        }
    }

    /// A close is done (or failed): the stream is clean again, `acked`
    /// (the packet ending there, written with the close) is visible, and
    /// `done` gets the result.
    fn closed(&self, r: FsResult<()>, acked: Option<u64>, done: Done) {
        let mut s = lock(&self.st);
        let wake = self.settle_close(&mut s, &r, acked);
        drop(s);
        if let Some(w) = wake {
            w(Ok(()));
        }
        done(r)
    }

    /// The stream's state after a close with result `r`; returns a
    /// blocked write the acknowledgement of `acked` lets go on.
    fn settle_close(
        &self,
        s: &mut StreamState,
        r: &FsResult<()>,
        acked: Option<u64>,
    ) -> Option<Done> {
        match r {
            Ok(()) => {
                let wake = acked.and_then(|end| {
                    self.ctx.metrics.packet_acked();
                    s.ack(end, &mut || self.take_unit())
                });
                s.closed();
                wake
            }
            // The file's close is not recorded: the descriptor is done
            // (later calls get the same error) and its release closes the
            // file by lease recovery.
            Err(e) => {
                tracing::error!(ino = self.ino, "close failed: {e}");
                s.fail(e.clone());
                None
            }
        }
    }

    /// The close of a file whose last block is all in `p`: its replicas
    /// written whole (no rbw file, no renames), and block and close
    /// recorded in one commit, under the stream's lock as in
    /// [`Self::close_now`]. The packet becomes visible with the record.
    fn send_whole(&self, streamer: &mut DataStreamer, p: Packet, done: Done) {
        let end = p.end();
        let r = self.contained(|| {
            let whole = streamer.write_whole(&p)?;
            let s = lock(&self.st);
            streamer.record_closed_whole(whole, &p.data, end, s.mtime())
        });
        self.closed(r, Some(end), done)
    }

    /// The fsync of a file whose last block is all in `p`, its only packet
    /// (every small file made durable before its close): the replicas are
    /// written whole into `finalized/` and the block recorded finished,
    /// then all of it is made durable as any fsync does. The close that
    /// usually follows has no replica left to finalise. A failed fsync
    /// fails the stream, as on the packet path. Returns the fsync's
    /// result, and whether the worker went idle (nothing else queued): the
    /// fsync's caller is then answered with the streamer already free, so
    /// that the close right behind it finds nothing running and is made on
    /// its own thread ([`Self::close_here`]).
    fn sync_whole(&self, streamer: &mut DataStreamer, p: Packet) -> (FsResult<()>, bool) {
        let end = p.end();
        // A utimensat racing with this fsync may see its time overwritten
        // by this one until the close, which records the stream's time
        // whenever it differs from the one recorded here.
        let mtime = lock(&self.st).mtime();
        let r = self.contained(|| streamer.sync_whole(&p, mtime));
        let mut s = lock(&self.st);
        let wake = match &r {
            Ok(()) => {
                self.ctx.metrics.packet_acked();
                s.ack(end, &mut || self.take_unit())
            }
            Err(e) => {
                tracing::error!(ino = self.ino, "fsync failed: {e}");
                s.fail_first(e.clone());
                None
            }
        };
        let idle = s.idle_if_drained();
        drop(s);
        if idle {
            self.idle.notify_all();
        }
        if let Some(w) = wake {
            w(Ok(()));
        }
        (r, idle)
    }

    /// One packet through the pipeline, then the acknowledgement of each
    /// packet it holds (`merged`: the ends of the queued packets merged
    /// into it, [`StreamState::merge_following`]; empty for a packet
    /// alone), which may let a blocked write go on.
    fn send(&self, streamer: &mut DataStreamer, p: Packet, merged: &[u64]) {
        let end = p.end();
        let ends = if merged.is_empty() {
            std::slice::from_ref(&end)
        } else {
            merged
        };
        let r = self.contained(|| streamer.send(&p));
        let mut s = lock(&self.st);
        let wake = match r {
            Ok(()) => {
                self.ctx.metrics.packets_merged(ends.len() as u64);
                let mut wake = Vec::new();
                for &end in ends {
                    self.ctx.metrics.packet_acked();
                    wake.extend(s.ack(end, &mut || self.take_unit()));
                }
                wake
            }
            Err(e) => {
                tracing::error!(ino = self.ino, "write pipeline failed: {e}");
                s.fail(e);
                Vec::new()
            }
        };
        drop(s);
        for d in wake {
            d(Ok(()));
        }
    }

    /// The visible length for readers on other daemons, when the namespace
    /// is shared.
    fn publish_length(&self, streamer: &DataStreamer) -> FsResult<()> {
        if !self.ctx.publish_lengths {
            return Ok(());
        }
        let (size, mtime) = {
            let s = lock(&self.st);
            (s.visible_len(), s.mtime())
        };
        streamer.publish_length(size, mtime)
    }

    /// Finalises the last block and records the file closed, with the
    /// length and time read under the stream's lock (see [`Self::set_mtime`]).
    fn close_now(&self, streamer: &mut DataStreamer) -> FsResult<()> {
        let last = streamer.finish_block()?;
        let s = lock(&self.st);
        let r = streamer.record_closed(last, s.visible_len(), s.mtime());
        drop(s);
        r
    }

    fn barrier(self: &Arc<Self>, kind: Barrier, done: Done) {
        let mut s = lock(&self.st);
        let queued = s.barrier(kind, done);
        self.queued(s, queued);
    }

    /// Completes what could be completed at once; otherwise starts the
    /// worker if none runs.
    fn queued(self: &Arc<Self>, mut s: crate::sync::MutexGuard<'_, StreamState>, q: Enqueued) {
        match q {
            Enqueued::Now(done, r) => {
                drop(s);
                done(r)
            }
            Enqueued::Queued => {
                let start = s.claim_streamer();
                drop(s);
                if start {
                    self.spawn_worker();
                }
            }
        }
    }

    /// hflush: every byte written so far is acknowledged by every replica
    /// (and so visible to readers) before `done`.
    pub fn flush(self: &Arc<Self>, done: Done) {
        self.barrier(Barrier::Flush, done)
    }

    /// hsync: as flush, then data, checksums and metadata are durable.
    pub fn sync(self: &Arc<Self>, done: Done) {
        self.barrier(Barrier::Sync, done)
    }

    /// Flushes, finalises the last block and has the file recorded closed
    /// (its length, blocks, and the end of its time under construction).
    /// The stream stays usable; a close with nothing written since the
    /// last one does nothing.
    pub fn close(self: &Arc<Self>, done: Done) {
        if let Some(done) = self.close_here(done) {
            self.barrier(Barrier::Close, done)
        }
    }

    /// A close with nothing to send or finalise (every byte acknowledged,
    /// no block open: a small file after its whole fsync) is one metadata
    /// commit, as any namespace change is: made here, on the caller's
    /// thread, rather than handed to a worker whose reply comes back to
    /// the request's thread (two wake-ups, most of such a close's time).
    /// Gives `done` back when the close must go through the worker.
    /// Not over a shared namespace (`publish_lengths`): there the commit
    /// goes over the network, which no request thread waits for.
    fn close_here(self: &Arc<Self>, done: Done) -> Option<Done> {
        if self.ctx.publish_lengths {
            return Some(done);
        }
        let mut s = lock(&self.st);
        if !s.claim_for_close() {
            return Some(done);
        }
        // Unclaimed by a worker, the streamer is free; were it not, the
        // close goes the usual way.
        let streamer = match self.streamer.try_lock() {
            Ok(g) if !g.block_open() => Some(g),
            _ => None,
        };
        let Some(mut streamer) = streamer else {
            s.release_after_close();
            return Some(done);
        };
        drop(s);
        let r = self.contained(|| self.close_now(&mut streamer));
        drop(streamer);
        // The streamer is given back before `done` runs (which may act on
        // the stream again); a write queued meanwhile found it claimed,
        // and its worker starts now.
        let mut s = lock(&self.st);
        // Nothing is acknowledged by this close: no write to wake.
        self.settle_close(&mut s, &r, None);
        let more = s.release_after_close();
        drop(s);
        if more {
            self.spawn_worker();
        } else {
            self.idle.notify_all();
        }
        // Counted before the caller hears of it.
        self.ctx.metrics.closed_on_caller();
        done(r);
        None
    }

    /// Shrinks (or grows with zeros) the file after everything before it.
    /// Growth beyond what the datanodes could hold were its zeros ever
    /// written out (a copy of a replica writes them) fails with `ENOSPC`
    /// at once, before anything is queued or written.
    pub fn truncate(self: &Arc<Self>, size: u64, done: Done) {
        let mut s = lock(&self.st);
        let growth = size.saturating_sub(s.pos());
        if growth > 0 && growth > self.ctx.dns.growth_room() {
            drop(s);
            tracing::warn!(
                ino = self.ino,
                uid = self.uid,
                growth,
                "truncate growth refused: more than the datanodes have room for"
            );
            return done(Err(FsError::NoSpace));
        }
        let queued = s.truncate(size, done, now_ns());
        self.queued(s, queued);
    }

    /// Fences the stream (its lease was preempted): every queued and later
    /// operation fails with `err`, and this returns once the worker is idle
    /// so that recovery may touch the replicas.
    pub fn abort(&self, err: FsError) {
        let mut s = lock(&self.st);
        s.fail_first(err);
        let mut failed = Vec::new();
        if !s.is_streaming() {
            failed = s.take_callbacks();
        }
        while s.is_streaming() {
            s = self.idle.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        let e = s.failed().cloned();
        drop(s);
        for d in failed {
            d(Err(e.clone().unwrap_or(FsError::BadHandle)));
        }
        // The worker is idle: drop the replica files it had open.
        lock(&self.streamer).reset();
    }

    /// Sets the file's modification time while a writer has it (utimensat
    /// after writing: tar, rsync, cp -p) and runs `record` under the same
    /// lock, so that the close, which records the stream's time, can neither
    /// overwrite it nor be overwritten by an older value.
    pub fn set_mtime<R>(&self, mtime: i64, record: impl FnOnce() -> R) -> R {
        let mut s = lock(&self.st);
        s.set_mtime(mtime);
        record()
    }

    /// Written or truncated through at all.
    pub fn is_dirty(&self) -> bool {
        lock(&self.st).is_dirty()
    }

    pub fn is_failed(&self) -> Option<FsError> {
        lock(&self.st).failed().cloned()
    }
}

impl UnitWaiter for OutputStream {
    /// The write buffer handed this stream the unit it queued for: a
    /// blocked write goes on.
    fn unit_granted(self: Arc<Self>, unit: Unit) {
        let mut s = lock(&self.st);
        let granted = s.unit_granted(unit, &mut || self.take_unit());
        let start = s.claim_streamer();
        drop(s);
        drop(granted.spare);
        if start {
            self.spawn_worker();
        }
        if let Some(done) = granted.done {
            done(Ok(()))
        }
    }
}
