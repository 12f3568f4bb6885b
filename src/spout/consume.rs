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
use super::{Emitter, Layout, Spout, SpoutError, Stats};
use crate::clock::wall_ms;
use crate::sync::AtomicBool;

/// What happened to a claimed file.
enum Outcome {
    Done,
    Bad,
    /// Lost to another instance, or left locked because we were stopped.
    Abandoned,
}

pub(super) struct Run<'a> {
    claimer: Claimer<'a>,
    emitter: &'a mut dyn Emitter,
}

/// Where a file's consumption stands: what was emitted, the commit points
/// not yet acknowledged by the consumer, and what the lock file says.
#[derive(Default)]
struct Tally {
    emitted: u64,
    /// (records emitted, position after them), oldest first.
    points: VecDeque<(u64, Position)>,
    committed: Position,
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
        let renewer =
            Renewer::start(renew_interval).map_err(|e| SpoutError::io("renewal thread", e))?;
        Ok(Run {
            claimer: Claimer::new(spout, layout, stop, renewer),
            emitter,
        })
    }

    fn stopping(&self) -> bool {
        self.claimer.stopping()
    }

    pub fn run(mut self) -> Result<Stats, SpoutError> {
        let result = self.main_loop();
        // The consumer is finished in every case (an --exec command gets
        // EOF); its error matters only when the run itself went well.
        let finished = self.emitter.finish();
        result?;
        finished?;
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

    /// Reads the claimed file from its start, emitting and committing what
    /// the consumer acknowledged. The whole rest of the file is checked
    /// first, so a file that is not text goes to the bad directory without
    /// emitting any of it.
    fn consume_records(&mut self, claim: &Claim) -> Result<Outcome, SpoutError> {
        if let Some(e) = &claim.unusable {
            tracing::warn!(
                "{}: its lock's entry cannot be resumed ({e}); moving it to the bad directory",
                claim.display()
            );
            return Ok(Outcome::Bad);
        }
        if let Some(o) = self.check_file(claim)? {
            return Ok(o);
        }
        let mut reader = match RecordReader::open(&claim.data, claim.start) {
            Ok(r) => r,
            Err(e) => return self.unreadable(claim, e),
        };
        let s = self.claimer.spout;
        self.emitter.begin_file(&claim.name)?;
        let mut tally = Tally {
            committed: claim.start,
            ..Tally::default()
        };
        let mut since_commit = 0u64;
        let mut last_commit = Instant::now();
        loop {
            if self.stopping() {
                // Finish cleanly: what the consumer took is committed, the
                // lock file stays for a takeover that resumes exactly there.
                self.emitter.end_file()?;
                self.commit(claim, &mut tally, reader.position(), true)?;
                tracing::info!(
                    "stopping: {} left at offset {}",
                    claim.display(),
                    tally.committed.bytes
                );
                return Ok(Outcome::Abandoned);
            }
            if !claim.still_held() {
                tracing::warn!(
                    "lost the lock of {} to another instance; abandoning it",
                    claim.display()
                );
                return Ok(Outcome::Abandoned);
            }
            let at = reader.offset();
            let record = match reader.next_record() {
                Ok(Some(r)) => r,
                Ok(None) if claim.data_lease.is_none() && self.grew(claim, at) => continue,
                Ok(None) => break,
                Err(e) => return self.unreadable(claim, e),
            };
            self.emitter.emit(record)?;
            tally.emitted += 1;
            s.progress.records(1);
            since_commit += 1;
            if (s.commit_count > 0 && since_commit >= s.commit_count)
                || last_commit.elapsed() >= s.commit_interval
            {
                if !self.commit(claim, &mut tally, reader.position(), false)? {
                    return Ok(Outcome::Abandoned);
                }
                since_commit = 0;
                last_commit = Instant::now();
            }
        }
        // Every record was delivered (or this fails), and the last commit
        // covers the whole file: if we die before the move, a takeover
        // re-emits nothing.
        self.emitter.end_file()?;
        if !self.commit(claim, &mut tally, reader.position(), true)? {
            return Ok(Outcome::Abandoned);
        }
        Ok(Outcome::Done)
    }

    /// Without the data file's lease, whether it grew past `offset` (a
    /// writer appended): then reading goes on.
    fn grew(&self, claim: &Claim, offset: u64) -> bool {
        std::fs::metadata(&claim.data).is_ok_and(|m| m.len() > offset)
    }

    /// Validates the rest of the file; Some(outcome) when it is bad.
    fn check_file(&mut self, claim: &Claim) -> Result<Option<Outcome>, SpoutError> {
        match RecordReader::open(&claim.data, claim.start).and_then(|r| r.validate()) {
            Ok(_) => Ok(None),
            Err(e) => self.unreadable(claim, e).map(Some),
        }
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

    /// A commit point at `at` (after `tally.emitted` records): hands the
    /// records on, then records the furthest point the consumer has
    /// acknowledged (`all`: every emitted record is delivered, the file's
    /// end or a clean stop). Ok(false): the lease was lost. Other
    /// lock-file errors are logged and retried at the next commit, as
    /// Storm does.
    fn commit(
        &mut self,
        claim: &Claim,
        tally: &mut Tally,
        at: Position,
        all: bool,
    ) -> Result<bool, SpoutError> {
        tally.points.push_back((tally.emitted, at));
        let acked = if all {
            tally.emitted
        } else {
            self.emitter.flush()?;
            self.emitter.acknowledged()?.unwrap_or(tally.emitted)
        };
        let mut to = None;
        while tally.points.front().is_some_and(|(n, _)| *n <= acked) {
            to = tally.points.pop_front().map(|(_, p)| p);
        }
        let Some(to) = to.filter(|p| *p != tally.committed) else {
            return Ok(true);
        };
        match claim.lock.commit(to, wall_ms()) {
            Ok(()) => {
                tally.committed = to;
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
        match DirLock::acquire(
            &self.claimer.renewer,
            locks_dir,
            self.claimer.spout.lock_timeout,
            wall_ms(),
        ) {
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
