//! Storm's `FileLock` and `DirLock`, held as leasefs write leases.
//!
//! A lock file `LOCKDIR/NAME` is claimed by creating it exclusively and
//! stays open for append under a client-renewed lease for as long as the
//! file `NAME` is consumed; it doubles as the progress log, in Storm's
//! format ([`super::entry`]). Storm can only guess whether a silent owner
//! is dead (timestamps older than the lock timeout). On leasefs the guess
//! is confirmed by the lease: an idle lock file is taken over only if
//! opening it for append succeeds, which it does only once the owner's
//! lease was released (exit, kill -9) or expired (not renewed for the
//! mount's soft limit). A live, renewing owner is never dispossessed
//! however idle its lock file looks, and an owner that lost its lease is
//! fenced: its writes fail with `EIO`. Those opens never wait
//! (`O_NONBLOCK`), even on mounts with `lease_wait`: a held lock is simply
//! not taken.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::entry::{LogEntry, Offset, Position, read_last_entry};
use super::error::SpoutError;
use super::idle::{Judge, mtime_ms};
use super::renew::{RenewedLease, Renewer};
use crate::sync::{AtomicBool, Ordering};

/// The name of the lock directory's own lock (Storm's `DirLock`).
pub const DIRLOCK: &str = "DIRLOCK";

/// Why a lock operation failed.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// The lease was preempted: another instance owns the lock now.
    #[error("the lock's lease was taken over by another instance")]
    Lost,
    /// The filesystem refused the client-renewal ioctl: not leasefs.
    #[error("client renewal refused: {0}")]
    NoClientRenewal(std::io::Error),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

fn is_errno(e: &std::io::Error, errno: i32) -> bool {
    e.raw_os_error() == Some(errno)
}

/// A held lease (`EBUSY`, or `EAGAIN` from a non-blocking open).
fn is_busy(e: &std::io::Error) -> bool {
    is_errno(e, libc::EBUSY) || is_errno(e, libc::EAGAIN)
}

/// Opens an existing lock for append without waiting for its lease (a
/// mount's `lease_wait` would hold the scan up behind a live owner), then
/// makes the descriptor blocking again for the writes.
fn open_append_now(path: &Path) -> std::io::Result<File> {
    let f = OpenOptions::new()
        .append(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    set_blocking(&f);
    Ok(f)
}

/// Clears `O_NONBLOCK`, which was only for the open.
pub(super) fn set_blocking(file: &File) {
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    if let Ok(bits) = fcntl(file, FcntlArg::F_GETFL) {
        let flags = OFlag::from_bits_truncate(bits) & !OFlag::O_NONBLOCK;
        let _ = fcntl(file, FcntlArg::F_SETFL(flags));
    }
}

/// Unlinks `path` only if it still names the inode `lease` has open, and
/// only while the lease is still ours: an owner resumed after a takeover
/// must not delete the new owner's lock.
fn unlink_if_ours(path: &Path, lease: &RenewedLease) -> Result<(), LockError> {
    if !lease.renew_now() {
        return Err(LockError::Lost);
    }
    let mine = lease.file().metadata()?.ino();
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.ino() == mine => Ok(std::fs::remove_file(path)?),
        Ok(_) => Err(LockError::Lost),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(LockError::Lost),
        Err(e) => Err(e.into()),
    }
}

/// A held lock on one data file, and its progress log.
#[derive(Debug)]
pub struct FileLock {
    path: PathBuf,
    spout_id: String,
    lease: RenewedLease,
    /// The file holds an entry: the next one starts with a newline (as
    /// Storm writes them).
    started: AtomicBool,
}

/// What came of trying to take over an idle lock file.
#[derive(Debug)]
pub enum TakeOver {
    /// Taken (nothing written yet): `previous` is the last entry, read
    /// once the lease was ours (`None`: the lock file held none, resume
    /// at the start). The caller finds that place in the data file and
    /// records it with [`FileLock::commit`].
    Taken {
        lock: FileLock,
        previous: Option<LogEntry>,
    },
    /// Not idle for long enough (by mtime or by its last entry).
    NotIdle,
    /// Idle, but its owner still holds the lease (alive and renewing).
    Held,
    /// The lock file disappeared meanwhile.
    Gone,
}

impl FileLock {
    /// Claims `path` by creating it exclusively; `Ok(None)` when it exists
    /// (another instance has the file). The first entry records offset 0.
    pub fn try_create(
        renewer: &Renewer,
        path: &Path,
        spout_id: &str,
        now_ms: u64,
    ) -> Result<Option<FileLock>, LockError> {
        let file = match OpenOptions::new()
            .append(true)
            .create_new(true)
            .mode(0o644)
            .open(path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists || is_busy(&e) => {
                return Ok(None);
            }
            Err(e) => return Err(e.into()),
        };
        let lease = match renewer.adopt_watched(file) {
            Ok(l) => l,
            Err(e) => {
                let _ = std::fs::remove_file(path);
                return Err(LockError::NoClientRenewal(e));
            }
        };
        let lock = FileLock {
            path: path.to_path_buf(),
            spout_id: spout_id.to_string(),
            lease,
            started: AtomicBool::new(false),
        };
        if let Err(e) = lock.commit(Position::default(), now_ms) {
            let _ = lock.release();
            return Err(e);
        }
        Ok(Some(lock))
    }

    /// Takes over `path` if it is idle by `judge` (Storm's rule with clocks
    /// in sync: its mtime and its last entry's time both at or before
    /// `now - timeout`; else: seen unchanged for the timeout) **and** its
    /// lease can be had: the open for append succeeds only once the owner
    /// released it or stopped renewing for the mount's soft limit (the
    /// daemon recovers the file first).
    pub fn take_over(
        renewer: &Renewer,
        path: &Path,
        spout_id: &str,
        judge: Judge<'_>,
    ) -> Result<TakeOver, LockError> {
        let meta = match std::fs::metadata(path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(TakeOver::Gone),
            Err(e) => return Err(e.into()),
        };
        if !judge.idle(path, &meta) {
            return Ok(TakeOver::NotIdle);
        }
        match read_last_entry(path) {
            Ok(Some(e)) if !judge.entry_idle(&e) => return Ok(TakeOver::NotIdle),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(TakeOver::Gone),
            Err(e) => return Err(e.into()),
        }
        let file = match open_append_now(path) {
            Ok(f) => f,
            Err(e) if is_busy(&e) => return Ok(TakeOver::Held),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(TakeOver::Gone),
            Err(e) => return Err(e.into()),
        };
        let lease = renewer
            .adopt_watched(file)
            .map_err(LockError::NoClientRenewal)?;
        // The lease is ours now and the old owner is fenced: what the file
        // holds at this point is final, so read the entry to resume from
        // again (the owner may have committed between our checks). A lock
        // deleted meanwhile (its owner finished) is simply gone.
        let previous = match read_last_entry(path) {
            Ok(p) => p,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(TakeOver::Gone),
            Err(e) => return Err(e.into()),
        };
        if !lease.file().metadata().is_ok_and(|m| m.nlink() > 0) {
            return Ok(TakeOver::Gone);
        }
        let started = lease.file().metadata().is_ok_and(|m| m.len() > 0);
        let lock = FileLock {
            path: path.to_path_buf(),
            spout_id: spout_id.to_string(),
            lease,
            started: AtomicBool::new(started),
        };
        Ok(TakeOver::Taken { lock, previous })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records progress up to `at`: one `write` of one whole entry (after
    /// a newline, but for the first, as Storm writes them), then `fsync`,
    /// so the entry is on every replica before the caller goes on. `EIO`
    /// means the lease was preempted (fenced).
    pub fn commit(&self, at: Position, now_ms: u64) -> Result<(), LockError> {
        if self.lease.is_lost() {
            return Err(LockError::Lost);
        }
        let entry = LogEntry {
            time_ms: now_ms,
            spout_id: self.spout_id.clone(),
            offset: Offset::of(at),
        }
        .to_line();
        let line = if self.started.load(Ordering::SeqCst) {
            format!("\n{entry}")
        } else {
            entry
        };
        let mut f = self.lease.file();
        let r = f.write(line.as_bytes()).and_then(|n| {
            if n == line.len() {
                f.sync_all()
            } else {
                Err(std::io::Error::new(
                    std::io::ErrorKind::WriteZero,
                    "short write to the lock file",
                ))
            }
        });
        match r {
            Ok(()) => {
                self.started.store(true, Ordering::SeqCst);
                Ok(())
            }
            Err(e) if is_errno(&e, libc::EIO) => {
                self.lease.mark_lost();
                Err(LockError::Lost)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Whether the lock is still ours; see [`RenewedLease::still_held`].
    pub fn still_held(&self) -> bool {
        self.lease.still_held()
    }

    /// Confirms the lease with a renewal now (before an irreversible step
    /// such as moving the data file).
    pub fn confirm(&self) -> Result<(), LockError> {
        if self.lease.renew_now() {
            Ok(())
        } else {
            Err(LockError::Lost)
        }
    }

    /// Deletes the lock file (the data file is finished) and closes it.
    pub fn release(self) -> Result<(), LockError> {
        unlink_if_ours(&self.path, &self.lease)
        // Dropping `self` closes the descriptor: the lease is released.
    }

    /// Closes the lock file without deleting it: the lease is released and
    /// the lock, with its last entry, is left for a takeover once idle.
    pub fn abandon(self) {}
}

/// `LOCKDIR/DIRLOCK`, held while a spout looks for idle lock files to take
/// over, so that two instances do not race through the same scan.
#[derive(Debug)]
pub struct DirLock {
    path: PathBuf,
    lease: RenewedLease,
}

impl DirLock {
    /// Creates `DIRLOCK` exclusively, or takes over one that is stale:
    /// idle by `judge` and with a lease that was released or expired (its
    /// owner died or stopped mid-scan). `Ok(None)` when another instance
    /// holds it.
    pub fn acquire(
        renewer: &Renewer,
        lock_dir: &Path,
        judge: Judge<'_>,
    ) -> Result<Option<DirLock>, LockError> {
        let path = lock_dir.join(DIRLOCK);
        let opened = OpenOptions::new()
            .append(true)
            .create_new(true)
            .mode(0o644)
            .open(&path);
        let file = match opened {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists || is_busy(&e) => {
                match Self::open_stale(&path, judge)? {
                    Some(f) => {
                        tracing::warn!(path = %path.display(), "took over a stale DIRLOCK");
                        f
                    }
                    None => return Ok(None),
                }
            }
            Err(e) => return Err(e.into()),
        };
        let lease = match renewer.adopt(file) {
            Ok(l) => l,
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                return Err(LockError::NoClientRenewal(e));
            }
        };
        Ok(Some(DirLock { path, lease }))
    }

    /// Opens an existing DIRLOCK for append if it is stale.
    fn open_stale(path: &Path, judge: Judge<'_>) -> Result<Option<File>, LockError> {
        match std::fs::metadata(path) {
            Ok(m) if judge.idle(path, &m) => {}
            Ok(_) => return Ok(None),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e.into()),
        }
        let file = match open_append_now(path) {
            Ok(f) => f,
            Err(e) if is_busy(&e) || e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(None);
            }
            Err(e) => return Err(e.into()),
        };
        // The name may have been replaced by a fresh DIRLOCK between the
        // stat and the open; only a stale one may be taken.
        if !judge.idle(path, &file.metadata()?) {
            return Ok(None);
        }
        Ok(Some(file))
    }

    /// Deletes DIRLOCK (unless it was taken over meanwhile) and closes it.
    pub fn release(self) -> Result<(), LockError> {
        let r = unlink_if_ours(&self.path, &self.lease);
        if let Err(LockError::Lost) = r {
            tracing::warn!(path = %self.path.display(), "DIRLOCK was taken over while held; left to its new owner");
            return Ok(());
        }
        r
    }
}

/// Lock files of `lock_dir` (DIRLOCK excluded) with their metadata, oldest
/// modification first.
pub fn list_lock_files(lock_dir: &Path) -> std::io::Result<Vec<(PathBuf, std::fs::Metadata)>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(lock_dir)? {
        let entry = entry?;
        if entry.file_name() == DIRLOCK {
            continue;
        }
        let meta = match entry.metadata() {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        if meta.is_file() {
            out.push((entry.path(), meta));
        }
    }
    out.sort_by(|a, b| {
        mtime_ms(&a.1)
            .cmp(&mtime_ms(&b.1))
            .then_with(|| a.0.cmp(&b.0))
    });
    Ok(out)
}

/// Whether `lock_dir` has a lock file idle by `judge` (its metadata only),
/// the cheap test that decides whether a scan under DIRLOCK is worth it.
pub fn any_idle(locks: &[(PathBuf, std::fs::Metadata)], judge: Judge<'_>) -> bool {
    locks.iter().any(|(p, m)| judge.idle(p, m))
}

/// Turns a lock error of `path` into the run's error; `Lost` (not an error
/// of the run) must be handled by the caller before.
pub(super) fn lock_err(path: &Path, e: LockError) -> SpoutError {
    match e {
        LockError::NoClientRenewal(e) => SpoutError::NotLeasefs {
            path: path.to_path_buf(),
            source: e,
        },
        LockError::Io(e) => SpoutError::io(path, e),
        LockError::Lost => SpoutError::io(path, std::io::Error::other("lease lost")),
    }
}
