//! The run loop of one spout: pick a file (an idle lock to take over
//! first, else the oldest new file), consume it, repeat.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::dirs::{self, INPROGRESS};
use super::lock::{self, DirLock, FileLock, LockError, TakeOver};
use super::reader::{ReadError, RecordReader};
use super::renew::Renewer;
use super::{Emitter, Layout, Spout, SpoutError, Stats};
use crate::clock::wall_ms;
use crate::sync::{AtomicBool, Ordering};

/// A file this instance holds the lock of.
struct Claim {
    lock: FileLock,
    /// The name without `.inprogress` (also the lock file's name).
    name: String,
    /// `SOURCE/NAME.inprogress`.
    data: PathBuf,
    /// Where to start reading.
    start: u64,
}

/// What happened to a claimed file.
enum Outcome {
    Done,
    Bad,
    /// Lost to another instance, or left locked because we were stopped.
    Abandoned,
}

pub(super) struct Run<'a> {
    spout: &'a Spout,
    layout: &'a Layout,
    emitter: &'a mut dyn Emitter,
    stop: &'a AtomicBool,
    renewer: Renewer,
    /// Candidates from the last listing, oldest first. A directory is
    /// listed again only once they are used up, so picking each of N files
    /// does not cost a listing of N entries (N² for the directory).
    queue: VecDeque<PathBuf>,
}

fn not_leasefs(path: &Path, e: std::io::Error) -> SpoutError {
    SpoutError::NotLeasefs {
        path: path.to_path_buf(),
        source: e,
    }
}

/// Turns a lock error of `path` into the run's error; `Lost` (not an error
/// of the run) must be handled by the caller before.
fn lock_err(path: &Path, e: LockError) -> SpoutError {
    match e {
        LockError::NoClientRenewal(e) => not_leasefs(path, e),
        LockError::Io(e) => SpoutError::io(path, e),
        LockError::Lost => SpoutError::io(path, std::io::Error::other("lease lost")),
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
    ) -> Result<Self, SpoutError> {
        let renewer = Renewer::start(spout.renew_interval)
            .map_err(|e| SpoutError::io("renewal thread", e))?;
        Ok(Run {
            spout,
            layout,
            emitter,
            stop,
            renewer,
            queue: VecDeque::new(),
        })
    }

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    pub fn run(mut self) -> Result<Stats, SpoutError> {
        let result = self.main_loop();
        // The consumer is finished in every case (an --exec command gets
        // EOF); its error matters only when the run itself went well.
        let finished = self.emitter.finish();
        result?;
        finished?;
        Ok(self.spout.progress.snapshot())
    }

    fn main_loop(&mut self) -> Result<(), SpoutError> {
        while !self.stopping() {
            if let Some(claim) = self.next_file()? {
                self.consume(claim)?;
                continue;
            }
            if self.spout.once && self.nothing_left()? {
                self.warn_orphans();
                return Ok(());
            }
            self.sleep(self.spout.poll_interval);
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

    fn next_file(&mut self) -> Result<Option<Claim>, SpoutError> {
        if let Some(c) = self.take_over_idle()? {
            return Ok(Some(c));
        }
        self.claim_new()
    }

    /// Storm's first step: an abandoned file (idle lock, owner's lease
    /// gone) is resumed before any new file is started. DIRLOCK is only
    /// taken when some lock file is idle by its mtime at all.
    fn take_over_idle(&mut self) -> Result<Option<Claim>, SpoutError> {
        let locks_dir = &self.layout.locks;
        let timeout = self.spout.lock_timeout;
        let locks = lock::list_lock_files(locks_dir).map_err(|e| SpoutError::io(locks_dir, e))?;
        if !lock::any_idle(&locks, wall_ms(), timeout) {
            return Ok(None);
        }
        let Some(dirlock) = DirLock::acquire(&self.renewer, locks_dir, timeout, wall_ms())
            .map_err(|e| lock_err(&locks_dir.join(lock::DIRLOCK), e))?
        else {
            return Ok(None);
        };
        let found = self.scan_idle(&locks);
        let released = dirlock.release();
        let found = found?;
        if let Err(e) = released {
            tracing::warn!("could not delete DIRLOCK: {e}");
        }
        Ok(found)
    }

    /// Under DIRLOCK: takes over the oldest idle lock whose lease can be had.
    fn scan_idle(&mut self, locks: &[(PathBuf, u64)]) -> Result<Option<Claim>, SpoutError> {
        let s = self.spout;
        for (path, _) in locks {
            let Some(name) = path
                .file_name()
                .and_then(|n| n.to_str())
                .map(str::to_string)
            else {
                continue;
            };
            let (lock, resume_from, previous) =
                match FileLock::take_over(&self.renewer, path, &s.id, s.lock_timeout, wall_ms()) {
                    Ok(TakeOver::Taken {
                        lock,
                        resume_from,
                        previous,
                    }) => (lock, resume_from, previous),
                    Ok(_) | Err(LockError::Lost) => continue,
                    Err(e) => return Err(lock_err(path, e)),
                };
            self.spout.progress.took_over();
            let prev = previous.map_or_else(
                || "no entry (empty or truncated lock file)".to_string(),
                |e| format!("last entry by {} at {}", e.spout_id, e.time_ms),
            );
            let Some((data, renamed_now)) = self.data_file_of(&name)? else {
                tracing::warn!(
                    "took over idle lock {} ({prev}) but {name} is gone from the source directory (finished by its last owner); deleting the lock",
                    path.display()
                );
                if let Err(e) = lock.release() {
                    tracing::warn!("could not delete {}: {e}", path.display());
                }
                continue;
            };
            // An owner emits nothing before its rename to `.inprogress`: a
            // file still under its plain name was never read (or is a new
            // file of the same name, published after an owner died between
            // its move to done and its lock's deletion). Start it at 0, and
            // record that before anything else.
            let resume_from = if renamed_now && resume_from > 0 {
                if let Err(e) = lock.commit(0, wall_ms()) {
                    tracing::warn!("cannot reset {}: {e}", path.display());
                    lock.abandon();
                    continue;
                }
                0
            } else {
                resume_from
            };
            tracing::warn!(
                "took over idle lock {} of {name} ({prev}); resuming at offset {resume_from}",
                path.display()
            );
            return Ok(Some(Claim {
                lock,
                name,
                data,
                start: resume_from,
            }));
        }
        Ok(None)
    }

    /// The data file of a taken-over lock: `NAME.inprogress`, or `NAME`
    /// (renamed now, and `true`) when its owner died between locking and
    /// renaming.
    fn data_file_of(&self, name: &str) -> Result<Option<(PathBuf, bool)>, SpoutError> {
        let src = &self.layout.source;
        let inprogress = dirs::inprogress_path(src, name);
        if inprogress.exists() {
            return Ok(Some((inprogress, false)));
        }
        match std::fs::rename(src.join(name), &inprogress) {
            Ok(()) => Ok(Some((inprogress, true))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(SpoutError::io(src.join(name), e)),
        }
    }

    /// Storm's second step: the oldest candidate that can be locked.
    fn claim_new(&mut self) -> Result<Option<Claim>, SpoutError> {
        let src = &self.layout.source;
        if self.queue.is_empty() {
            self.queue = dirs::list_candidates(src)
                .map_err(|e| SpoutError::io(src, e))?
                .into();
        }
        while let Some(path) = self.queue.pop_front() {
            if self.stopping() {
                return Ok(None);
            }
            if std::fs::symlink_metadata(&path).is_err() {
                continue; // claimed by another instance since the listing
            }
            let Some(name) = path
                .file_name()
                .and_then(|n| n.to_str())
                .map(str::to_string)
            else {
                continue;
            };
            if dirs::is_being_written(&path) {
                tracing::debug!("{name} is still open for writing; not claimed yet");
                continue;
            }
            let lock_path = self.layout.locks.join(&name);
            let lock =
                match FileLock::try_create(&self.renewer, &lock_path, &self.spout.id, wall_ms()) {
                    Ok(Some(l)) => l,
                    Ok(None) | Err(LockError::Lost) => continue,
                    Err(e) => return Err(lock_err(&lock_path, e)),
                };
            let data = dirs::inprogress_path(src, &name);
            match std::fs::rename(&path, &data) {
                Ok(()) => {}
                Err(e) => {
                    // Gone: another instance finished it between our listing
                    // and our lock (its lock was already deleted).
                    if e.kind() != std::io::ErrorKind::NotFound {
                        tracing::warn!(
                            "cannot rename {} to {INPROGRESS}: {e}; skipped",
                            path.display()
                        );
                    }
                    if let Err(e) = lock.release() {
                        tracing::warn!("could not delete {}: {e}", lock_path.display());
                    }
                    continue;
                }
            }
            tracing::info!("consuming {name}");
            return Ok(Some(Claim {
                lock,
                name,
                data,
                start: 0,
            }));
        }
        Ok(None)
    }

    /// Consumes one claimed file to its end (or until stopped or fenced).
    fn consume(&mut self, claim: Claim) -> Result<(), SpoutError> {
        let name = claim.name.clone();
        let outcome = self.consume_records(&claim);
        let Claim { lock, data, .. } = claim;
        let outcome = match outcome {
            Ok(o) => o,
            Err(e) => {
                // The lock stays (closed): whoever takes it over resumes
                // from the last commit.
                lock.abandon();
                return Err(e);
            }
        };
        let p = &self.spout.progress;
        match outcome {
            Outcome::Abandoned => {
                self.emitter.discard();
                lock.abandon();
                p.abandoned();
            }
            Outcome::Done => match self.finish_file(lock, &data, &self.layout.done, &name) {
                Ok(true) => p.done(),
                Ok(false) => p.abandoned(),
                Err(e) => return Err(e),
            },
            Outcome::Bad => match self.finish_file(lock, &data, &self.layout.bad, &name) {
                Ok(true) => p.bad(),
                Ok(false) => p.abandoned(),
                Err(e) => return Err(e),
            },
        }
        Ok(())
    }

    /// Moves the data file to `dir` and deletes its lock, only while the
    /// lease is still ours. Ok(false): it was taken over meanwhile.
    fn finish_file(
        &self,
        lock: FileLock,
        data: &Path,
        dir: &Path,
        name: &str,
    ) -> Result<bool, SpoutError> {
        if lock.confirm().is_err() {
            tracing::warn!(
                "lost the lock of {name} to another instance before moving it; left to its new owner"
            );
            return Ok(false);
        }
        let to = match dirs::move_into(data, dir, name) {
            Ok(to) => to,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // Our predecessor, resumed after we took its lock over,
                // finished the file and moved it (renames are not fenced).
                // Every record was emitted, by it or by us.
                tracing::warn!("{name} was already moved by its previous owner");
                if let Err(e) = lock.release() {
                    tracing::warn!("could not delete the lock of {name}: {e}");
                }
                return Ok(true);
            }
            Err(e) => {
                lock.abandon();
                return Err(SpoutError::io(data, e));
            }
        };
        tracing::info!("{name} -> {}", to.display());
        if let Err(e) = lock.release() {
            tracing::warn!("{name} is finished but its lock could not be deleted: {e}");
        }
        Ok(true)
    }

    /// Reads the claimed file from its start offset, emitting and
    /// committing. The whole rest of the file is checked first, so a file
    /// that is not text goes to the bad directory without emitting any of
    /// it.
    fn consume_records(&mut self, claim: &Claim) -> Result<Outcome, SpoutError> {
        if let Some(o) = self.check_file(claim)? {
            return Ok(o);
        }
        let mut reader = match RecordReader::open(&claim.data, claim.start) {
            Ok(r) => r,
            Err(e) => return self.unreadable(claim, e),
        };
        let s = self.spout;
        let mut since_commit = 0u64;
        let mut last_commit = Instant::now();
        loop {
            if self.stopping() {
                // Finish cleanly: what was emitted is committed, the lock
                // file stays for a takeover that resumes exactly here.
                self.commit(claim, reader.offset())?;
                tracing::info!(
                    "stopping: {} left at offset {}",
                    claim.name,
                    reader.offset()
                );
                return Ok(Outcome::Abandoned);
            }
            if !claim.lock.still_held() {
                tracing::warn!(
                    "lost the lock of {} to another instance; abandoning it",
                    claim.name
                );
                return Ok(Outcome::Abandoned);
            }
            let record = match reader.next_record() {
                Ok(Some(r)) => r,
                Ok(None) => break,
                Err(e) => return self.unreadable(claim, e),
            };
            self.emitter.emit(record)?;
            s.progress.records(1);
            since_commit += 1;
            if (s.commit_count > 0 && since_commit >= s.commit_count)
                || last_commit.elapsed() >= s.commit_interval
            {
                if !self.commit(claim, reader.offset())? {
                    return Ok(Outcome::Abandoned);
                }
                since_commit = 0;
                last_commit = Instant::now();
            }
        }
        // The last commit covers the whole file: if we die before the move,
        // a takeover re-emits nothing.
        if !self.commit(claim, reader.offset())? {
            return Ok(Outcome::Abandoned);
        }
        Ok(Outcome::Done)
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
                tracing::warn!("{}: {e}; moving it to the bad directory", claim.name);
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
                    claim.name
                );
                Ok(Outcome::Bad)
            }
        }
    }

    /// Flushes the emitter, then records `offset`. Ok(false): the lease
    /// was lost. Other lock-file errors are logged and retried at the next
    /// commit, as Storm does.
    fn commit(&mut self, claim: &Claim, offset: u64) -> Result<bool, SpoutError> {
        self.emitter.flush()?;
        match claim.lock.commit(offset, wall_ms()) {
            Ok(()) => Ok(true),
            Err(LockError::Lost) => {
                tracing::warn!(
                    "lost the lock of {} to another instance; abandoning it",
                    claim.name
                );
                Ok(false)
            }
            Err(e) => {
                tracing::warn!(
                    "cannot record progress of {}: {e}; retrying at the next commit",
                    claim.name
                );
                Ok(true)
            }
        }
    }

    /// For `--once`: nothing to claim, no lock file anywhere (every other
    /// instance's file finished or taken over), and no DIRLOCK left (a
    /// stale one, from an instance killed mid-scan, is recovered).
    fn nothing_left(&mut self) -> Result<bool, SpoutError> {
        let src = &self.layout.source;
        if !dirs::list_candidates(src)
            .map_err(|e| SpoutError::io(src, e))?
            .is_empty()
        {
            return Ok(false);
        }
        let locks_dir = &self.layout.locks;
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
        match DirLock::acquire(&self.renewer, locks_dir, self.spout.lock_timeout, wall_ms()) {
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
        let Ok(entries) = std::fs::read_dir(&self.layout.source) else {
            return;
        };
        for e in entries.flatten() {
            let n = e.file_name();
            let Some(name) = n.to_str().and_then(|n| n.strip_suffix(INPROGRESS)) else {
                continue;
            };
            if !self.layout.locks.join(name).exists() {
                tracing::warn!(
                    "{} has no lock file in {}: it is never consumed; rename it to {name} to consume it again from the start",
                    e.path().display(),
                    self.layout.locks.display()
                );
            }
        }
    }
}
