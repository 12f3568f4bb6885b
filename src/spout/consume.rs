//! The run loop of one spout: pick a file (see `claim`), consume it,
//! repeat; and what consuming one is: emitting its records, committing
//! what the consumer acknowledged, and moving it to done.

use std::collections::VecDeque;
use std::path::Path;
use std::time::{Duration, Instant};

use super::claim::{Claim, Claimer};
use super::dirs;
use super::entry::Position;
use super::lock::{self, DirLock, LockError, lock_err};
use super::reader::{ReadError, RecordReader};
use super::renew::Renewer;
use super::watch::Watch;
use super::{EmitError, Emitter, Layout, Spout, SpoutError, Stats};
use crate::clock::wall_ms;
use crate::sync::{AtomicBool, Ordering};

/// What happened to a claimed file.
enum Outcome {
    Done,
    /// Its good prefix was emitted (Storm's rule); it goes to the bad
    /// directory.
    Bad,
    /// Lost to another instance, or left locked because we were stopped.
    Abandoned,
    /// Its consumer made no progress for the progress timeout and was
    /// killed: the file is left (lock closed) for another instance.
    Stalled,
}

pub(super) struct Run<'a> {
    claimer: Claimer<'a>,
    emitter: &'a mut dyn Emitter,
    watch: Watch,
    /// The emitter reports its consumer's progress on `watch` itself.
    self_reporting: bool,
}

/// Commit points kept per file at most; past it every other one is
/// dropped, so a consumer that never acknowledges cannot make the spout
/// hold a point per record of a huge file (commits are then a little
/// coarser than acknowledgements, never past them).
const MAX_POINTS: usize = 1 << 16;
/// Acknowledgements are looked at every this many records while emitting.
const ACK_POLL_RECORDS: u64 = 256;
/// How often a wait for acknowledgements looks again.
const ACK_POLL: Duration = Duration::from_millis(20);

/// Where a file's consumption stands: what was emitted and acknowledged,
/// the places after the records not committed yet, and what the lock file
/// says.
#[derive(Default)]
struct Tally {
    emitted: u64,
    acked: u64,
    /// (records emitted, position after them), oldest first.
    points: VecDeque<(u64, Position)>,
    committed: Position,
    /// Records covered by `committed`, counted from where this claim
    /// started.
    committed_n: u64,
}

impl Tally {
    fn emitted_one(&mut self, at: Position) {
        self.emitted += 1;
        self.points.push_back((self.emitted, at));
        if self.points.len() > MAX_POINTS {
            let mut i = 0;
            self.points.retain(|_| {
                i += 1;
                i % 2 == 0
            });
        }
    }

    fn outstanding(&self) -> u64 {
        self.emitted - self.acked
    }
}

/// Errors that say the mount itself is gone: stop instead of moving files
/// to the bad directory one after the other.
fn mount_gone(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOTCONN) | Some(libc::ENODEV))
}

impl<'a> Run<'a> {
    pub fn new(
        spout: &'a Spout,
        layout: &'a Layout,
        emitter: &'a mut dyn Emitter,
        stop: &'a AtomicBool,
        renew_interval: Duration,
    ) -> Result<Self, SpoutError> {
        let watch = Watch::new(spout.progress_timeout);
        let renewer = Renewer::start(renew_interval, Some(watch.clone()))
            .map_err(|e| SpoutError::io("renewal thread", e))?;
        let self_reporting = emitter.watch(&watch);
        Ok(Run {
            claimer: Claimer::new(spout, layout, stop, renewer),
            emitter,
            watch,
            self_reporting,
        })
    }

    fn stopping(&self) -> bool {
        self.claimer.stopping()
    }

    pub fn run(mut self) -> Result<Stats, SpoutError> {
        // The caller's stop flag, copied into the watch that the emitter's
        // own waits read (the emitter cannot borrow the caller's flag).
        let over = AtomicBool::new(false);
        let stop = self.claimer.stop_flag();
        let watch = self.watch.clone();
        let result = std::thread::scope(|s| {
            s.spawn(|| {
                while !over.load(Ordering::SeqCst) {
                    if stop.load(Ordering::SeqCst) {
                        watch.request_stop();
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
            });
            let result = self.main_loop();
            // The consumer is finished in every case (an --exec command
            // gets EOF); its error matters only when the run went well.
            let finished = self.emitter.finish();
            over.store(true, Ordering::SeqCst);
            (result, finished)
        });
        let (result, finished) = result;
        result?;
        match finished {
            Ok(()) => {}
            // Stopped with the run: what it acknowledged was committed.
            Err(EmitError::Stopped { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        Ok(self.claimer.spout.progress.snapshot())
    }

    fn main_loop(&mut self) -> Result<(), SpoutError> {
        while !self.stopping() {
            if let Some(claim) = self.claimer.next_file()? {
                self.consume(claim)?;
                continue;
            }
            if self.claimer.spout.once && self.nothing_left()? {
                self.warn_orphans();
                return Ok(());
            }
            self.sleep(self.claimer.spout.poll_interval);
        }
        Ok(())
    }

    /// Sleeps, waking early when asked to stop.
    fn sleep(&self, d: Duration) {
        let end = Instant::now() + d;
        while !self.stopping() {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            std::thread::sleep(left.min(Duration::from_millis(50)));
        }
    }

    /// Consumes one claimed file to its end (or until stopped or fenced).
    fn consume(&mut self, mut claim: Claim) -> Result<(), SpoutError> {
        let outcome = self.consume_records(&claim);
        let data_lease = claim.data_lease.take();
        let Claim {
            lock, data, name, ..
        } = claim;
        let outcome = match outcome {
            Ok(o) => o,
            Err(e) => {
                // The lock stays (closed): whoever takes it over resumes
                // from the last commit.
                lock.abandon();
                return Err(e);
            }
        };
        let p = &self.claimer.spout.progress;
        match outcome {
            Outcome::Abandoned => {
                self.emitter.discard();
                lock.abandon();
                p.abandoned();
            }
            Outcome::Stalled => {
                // Closed, not deleted: its last entry is where whoever
                // takes it over resumes. Released now, not at the lease's
                // expiry.
                lock.abandon();
                p.abandoned();
                self.claimer.gave_up(&name);
            }
            Outcome::Done => {
                match self.finish_file(lock, &data, &self.claimer.layout.done, &name) {
                    Ok(true) => p.done(),
                    Ok(false) => p.abandoned(),
                    Err(e) => return Err(e),
                }
            }
            Outcome::Bad => match self.finish_file(lock, &data, &self.claimer.layout.bad, &name) {
                Ok(true) => p.bad(),
                Ok(false) => p.abandoned(),
                Err(e) => return Err(e),
            },
        }
        // The data file's lease goes only now, after the move: nobody
        // could append to it between our last read and the move.
        drop(data_lease);
        Ok(())
    }

    /// Moves the data file to `dir` and deletes its lock, only while the
    /// lease is still ours. Ok(false): it was taken over meanwhile.
    fn finish_file(
        &self,
        lock: lock::FileLock,
        data: &Path,
        dir: &Path,
        name: &std::ffi::OsStr,
    ) -> Result<bool, SpoutError> {
        let shown = name.to_string_lossy();
        if lock.confirm().is_err() {
            tracing::warn!(
                "lost the lock of {shown} to another instance before moving it; left to its new owner"
            );
            return Ok(false);
        }
        let to = match dirs::move_into(data, dir, name) {
            Ok(to) => to,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // Our predecessor, resumed after we took its lock over,
                // finished the file and moved it (renames are not fenced).
                // Every record was emitted, by it or by us.
                tracing::warn!("{shown} was already moved by its previous owner");
                if let Err(e) = lock.release() {
                    tracing::warn!("could not delete the lock of {shown}: {e}");
                }
                return Ok(true);
            }
            Err(e) => {
                lock.abandon();
                return Err(SpoutError::io(data, e));
            }
        };
        tracing::info!("{shown} -> {}", to.display());
        if let Err(e) = lock.release() {
            tracing::warn!("{shown} is finished but its lock could not be deleted: {e}");
        }
        Ok(true)
    }

    /// The lock's lease may have gone to another instance: the consumer's
    /// input ends now, before anything here touches the mount again (the
    /// data file's close would wait for a stalled daemon), so it acts on
    /// no record past the lease, by this instance's own clock.
    fn lost(&mut self, claim: &Claim) -> Outcome {
        tracing::warn!(
            "lost the lock of {} to another instance; abandoning it",
            claim.display()
        );
        self.emitter.discard();
        Outcome::Abandoned
    }

    /// Reads the claimed file from its start, emitting and committing what
    /// the consumer acknowledged. A record that is not text (invalid
    /// UTF-8, a NUL byte) ends the file's good prefix: what comes before
    /// it is emitted and acknowledged as usual, then the file goes to the
    /// bad directory (Storm's rule).
    fn consume_records(&mut self, claim: &Claim) -> Result<Outcome, SpoutError> {
        if let Some(e) = &claim.unusable {
            tracing::warn!(
                "{}: its lock's entry cannot be resumed ({e}); moving it to the bad directory",
                claim.display()
            );
            return Ok(Outcome::Bad);
        }
        let mut reader = match RecordReader::open(&claim.data, claim.start) {
            Ok(r) => r,
            Err(e) => return self.unreadable(claim, e),
        };
        let s = self.claimer.spout;
        self.watch.beat();
        self.emitter.begin_file(&claim.name)?;
        let mut tally = Tally {
            committed: claim.start,
            ..Tally::default()
        };
        let mut since_flush = 0u64;
        let mut last_commit = Instant::now();
        let mut bad = None;
        loop {
            if self.stopping() {
                return self.stop_in_file(claim, &mut tally);
            }
            if !claim.still_held() {
                return Ok(self.lost(claim));
            }
            if s.max_outstanding > 0 && tally.outstanding() >= s.max_outstanding {
                let max = s.max_outstanding;
                if let Some(o) = self.await_acks(claim, &mut tally, |t| t.outstanding() < max)? {
                    return Ok(o);
                }
                continue;
            }
            let at = reader.offset();
            let record = match reader.next_record() {
                Ok(Some(r)) => r,
                Ok(None) if claim.data_lease.is_none() && self.grew(claim, at) => continue,
                Ok(None) => break,
                Err(e @ ReadError::Invalid { .. }) => {
                    bad = Some(e);
                    break;
                }
                Err(e) => {
                    // Unreadable (EIO): its good prefix was emitted; what
                    // the consumer acknowledged of it is committed first.
                    bad = Some(e);
                    break;
                }
            };
            if let Err(e) = self.emitter.emit(record) {
                return self.gave_up(claim, &mut tally, e);
            }
            tally.emitted_one(reader.position());
            if !self.self_reporting {
                self.watch.beat();
            }
            s.progress.records(1);
            since_flush += 1;
            if s.commit_count > 0 && since_flush >= s.commit_count {
                // Hand the records on so that they can be acknowledged.
                since_flush = 0;
                if let Err(e) = self.flush_and_ack(&mut tally) {
                    return self.gave_up(claim, &mut tally, e);
                }
            } else if tally.emitted.is_multiple_of(ACK_POLL_RECORDS)
                && let Err(e) = self.poll_acks(&mut tally)
            {
                return self.gave_up(claim, &mut tally, e);
            }
            let by_time = last_commit.elapsed() >= s.commit_interval;
            if by_time && let Err(e) = self.flush_and_ack(&mut tally) {
                return self.gave_up(claim, &mut tally, e);
            }
            if by_time || self.count_due(&tally) {
                if !self.commit(claim, &mut tally)? {
                    return Ok(Outcome::Abandoned);
                }
                last_commit = Instant::now();
            }
        }
        if let Some(ReadError::Io(io)) = &bad
            && (mount_gone(io) || io.kind() == std::io::ErrorKind::NotFound)
            && let Some(e) = bad.take()
        {
            return self.unreadable(claim, e);
        }
        if let Some(e) = &bad {
            tracing::warn!(
                "{}: {e}; its {} good records before it are emitted, then it moves to the bad directory",
                claim.display(),
                tally.emitted
            );
        }
        // A consumer that acknowledges as it goes has its acknowledgements
        // committed while it works through the rest (the count commit
        // counts acknowledged records), not only once it exits. It gets
        // the end of its input first: one that acknowledges only by
        // exiting is waiting for it.
        if let Err(e) = self.emitter.close_input() {
            return self.gave_up(claim, &mut tally, e);
        }
        if let Some(o) = self.await_acks(claim, &mut tally, |t| t.acked >= t.emitted)? {
            return Ok(o);
        }
        // What was acknowledged is committed before the wait for the
        // consumer's exit, which may be long.
        if tally.acked > tally.committed_n && !self.commit(claim, &mut tally)? {
            return Ok(Outcome::Abandoned);
        }
        if self.stopping() {
            return self.stop_in_file(claim, &mut tally);
        }
        // Every record was delivered (or this fails), and the last commit
        // covers every emitted record: if we die before the move, a
        // takeover re-emits nothing.
        if let Err(e) = self.emitter.end_file() {
            return self.gave_up(claim, &mut tally, e);
        }
        tally.acked = tally.emitted;
        if !self.commit(claim, &mut tally)? {
            return Ok(Outcome::Abandoned);
        }
        Ok(if bad.is_some() {
            Outcome::Bad
        } else {
            Outcome::Done
        })
    }

    /// Asked to stop inside a file: no more records; the consumer finishes
    /// what it was given (an `--exec` command gets EOF and
    /// [`super::exec::STOP_GRACE`], then is killed), what it took is
    /// committed, and the lock file stays for a takeover that resumes
    /// exactly there.
    fn stop_in_file(&mut self, claim: &Claim, tally: &mut Tally) -> Result<Outcome, SpoutError> {
        match self.emitter.end_file() {
            Ok(()) => tally.acked = tally.emitted,
            Err(e) => match e.acknowledged_before_kill() {
                Some(n) => tally.acked = tally.acked.max(n.min(tally.emitted)),
                None => return Err(e.into()),
            },
        }
        self.commit(claim, tally)?;
        tracing::info!(
            "stopping: {} left at offset {}",
            claim.display(),
            tally.committed.bytes
        );
        Ok(Outcome::Abandoned)
    }

    /// The consumer failed: one that was given up (stalled, or stopped)
    /// has what it acknowledged committed and its file left; any other
    /// failure stops the run.
    fn gave_up(
        &mut self,
        claim: &Claim,
        tally: &mut Tally,
        e: EmitError,
    ) -> Result<Outcome, SpoutError> {
        let Some(n) = e.acknowledged_before_kill() else {
            return Err(e.into());
        };
        tally.acked = tally.acked.max(n.min(tally.emitted));
        self.emitter.abort();
        let stalled = matches!(e, EmitError::Stalled { .. });
        // Committed even when stalled: acknowledged records are delivered.
        self.commit(claim, tally)?;
        if stalled {
            tracing::warn!(
                "{}: {e}; its file is left at offset {} for another instance",
                claim.display(),
                tally.committed.bytes
            );
            Ok(Outcome::Stalled)
        } else {
            tracing::info!(
                "stopping: {} left at offset {}",
                claim.display(),
                tally.committed.bytes
            );
            Ok(Outcome::Abandoned)
        }
    }

    /// Enough records were acknowledged since the last commit.
    fn count_due(&self, t: &Tally) -> bool {
        let n = self.claimer.spout.commit_count;
        n > 0 && t.acked.saturating_sub(t.committed_n) >= n
    }

    /// Hands on what was emitted, then reads what was acknowledged.
    fn flush_and_ack(&mut self, tally: &mut Tally) -> Result<(), EmitError> {
        self.emitter.flush()?;
        match self.emitter.acknowledged()? {
            Some(n) => tally.acked = tally.acked.max(n.min(tally.emitted)),
            // Writers: everything flushed is delivered.
            None => tally.acked = tally.emitted,
        }
        Ok(())
    }

    /// Reads acknowledgements without handing anything on.
    fn poll_acks(&mut self, tally: &mut Tally) -> Result<(), EmitError> {
        if let Some(n) = self.emitter.acknowledged()? {
            tally.acked = tally.acked.max(n.min(tally.emitted));
        }
        Ok(())
    }

    /// Waits until `enough` holds, the consumer is gone or the spout
    /// stops, committing by count meanwhile. A consumer that makes no
    /// progress for the progress timeout is killed (Outcome::Stalled).
    fn await_acks(
        &mut self,
        claim: &Claim,
        tally: &mut Tally,
        enough: impl Fn(&Tally) -> bool,
    ) -> Result<Option<Outcome>, SpoutError> {
        if let Err(e) = self.flush_and_ack(tally) {
            return self.gave_up(claim, tally, e).map(Some);
        }
        loop {
            if self.count_due(tally) && !self.commit(claim, tally)? {
                return Ok(Some(Outcome::Abandoned));
            }
            if enough(tally) || self.stopping() || !self.emitter.consumer_running() {
                return Ok(None);
            }
            if !claim.still_held() {
                return Ok(Some(self.lost(claim)));
            }
            if self.watch.stalled() {
                let e = EmitError::Stalled {
                    cmd: "the consumer".into(),
                    quiet_ms: self.watch.quiet_for().as_millis() as u64,
                    acked: tally.acked,
                };
                return self.gave_up(claim, tally, e).map(Some);
            }
            std::thread::sleep(ACK_POLL);
            if let Err(e) = self.poll_acks(tally) {
                return self.gave_up(claim, tally, e).map(Some);
            }
        }
    }

    /// Without the data file's lease, whether it grew past `offset` (a
    /// writer appended): then reading goes on.
    fn grew(&self, claim: &Claim, offset: u64) -> bool {
        std::fs::metadata(&claim.data).is_ok_and(|m| m.len() > offset)
    }

    /// A read failed: bad content or an unreadable file goes to the bad
    /// directory; a file that vanished is left; a gone mount stops us.
    fn unreadable(&mut self, claim: &Claim, e: ReadError) -> Result<Outcome, SpoutError> {
        match e {
            ReadError::Invalid { .. } => {
                tracing::warn!("{}: {e}; moving it to the bad directory", claim.display());
                Ok(Outcome::Bad)
            }
            ReadError::Io(e) if mount_gone(&e) => Err(SpoutError::io(&claim.data, e)),
            ReadError::Io(e) if e.kind() == std::io::ErrorKind::NotFound => {
                tracing::warn!("{} vanished while being consumed", claim.data.display());
                Ok(Outcome::Abandoned)
            }
            ReadError::Io(e) => {
                tracing::warn!(
                    "{}: cannot be read ({e}); moving it to the bad directory",
                    claim.display()
                );
                Ok(Outcome::Bad)
            }
        }
    }

    /// Records the furthest place the consumer acknowledged (`tally.acked`
    /// records). Ok(false): the lease was lost. Other lock-file errors are
    /// logged and retried at the next commit, as Storm does.
    fn commit(&mut self, claim: &Claim, tally: &mut Tally) -> Result<bool, SpoutError> {
        let mut to = None;
        while tally.points.front().is_some_and(|(n, _)| *n <= tally.acked) {
            to = tally.points.pop_front();
        }
        let Some((n, to)) = to.filter(|(_, p)| *p != tally.committed) else {
            return Ok(true);
        };
        match claim.lock.commit(to, wall_ms()) {
            Ok(()) => {
                tally.committed = to;
                tally.committed_n = n;
                Ok(true)
            }
            Err(LockError::Lost) => {
                tracing::warn!(
                    "lost the lock of {} to another instance; abandoning it",
                    claim.display()
                );
                Ok(false)
            }
            Err(e) => {
                // Put back: the next commit tries this place again.
                tally.points.push_front((n, to));
                tracing::warn!(
                    "cannot record progress of {}: {e}; retrying at the next commit",
                    claim.display()
                );
                Ok(true)
            }
        }
    }

    /// For `--once`: nothing to claim, no lock file anywhere (every other
    /// instance's file finished or taken over), and no DIRLOCK left (a
    /// stale one, from an instance killed mid-scan, is recovered).
    fn nothing_left(&mut self) -> Result<bool, SpoutError> {
        let src = &self.claimer.layout.source;
        if !dirs::list_candidates(src)
            .map_err(|e| SpoutError::io(src, e))?
            .is_empty()
        {
            return Ok(false);
        }
        let locks_dir = &self.claimer.layout.locks;
        if !lock::list_lock_files(locks_dir)
            .map_err(|e| SpoutError::io(locks_dir, e))?
            .is_empty()
        {
            return Ok(false);
        }
        let dirlock_path = locks_dir.join(lock::DIRLOCK);
        if !dirlock_path.exists() {
            return Ok(true);
        }
        match DirLock::acquire(&self.claimer.renewer, locks_dir, self.claimer.judge()) {
            Ok(Some(d)) => {
                d.release().map_err(|e| lock_err(&dirlock_path, e))?;
                Ok(true)
            }
            Ok(None) => Ok(false),
            Err(e) => Err(lock_err(&dirlock_path, e)),
        }
    }

    /// `.inprogress` files without a lock file can only come from outside
    /// the protocol (a lock deleted by hand): say so, they are never
    /// consumed.
    fn warn_orphans(&self) {
        let Ok(entries) = std::fs::read_dir(&self.claimer.layout.source) else {
            return;
        };
        for e in entries.flatten() {
            let n = e.file_name();
            let Some(name) = dirs::strip_inprogress(&n) else {
                continue;
            };
            if !self.claimer.layout.locks.join(name).exists() {
                tracing::warn!(
                    "{} has no lock file in {}: it is never consumed; rename it to {} to consume it again from the start",
                    e.path().display(),
                    self.claimer.layout.locks.display(),
                    name.to_string_lossy()
                );
            }
        }
    }
}
