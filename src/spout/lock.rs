//! Storm's `FileLock` and `DirLock`, held as leasefs write leases.
//!
//! A lock file `LOCKDIR/NAME` is claimed by creating it exclusively and
//! stays open for append under a client-renewed lease for as long as the
//! file `NAME` is consumed; it doubles as the progress log, one line
//! `<epoch-millis>,<spout-id>,<offset>` per commit. Storm can only guess
//! whether a silent owner is dead (timestamps older than the lock
//! timeout). On leasefs the guess is confirmed by the lease: an idle lock
//! file is taken over only if opening it for append succeeds, which it does
//! only once the owner's lease was released (exit, kill -9) or expired (not
//! renewed for the mount's soft limit). A live, renewing owner is never
//! dispossessed however idle its lock file looks, and an owner that lost
//! its lease is fenced: its writes fail with `EIO`.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::renew::{RenewedLease, Renewer};

/// The name of the lock directory's own lock (Storm's `DirLock`).
pub const DIRLOCK: &str = "DIRLOCK";

/// Reading at most this much of a lock file's end finds its last entry.
const TAIL_BYTES: u64 = 64 * 1024;

/// One progress line of a lock file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEntry {
    /// When it was written, milliseconds since the Unix epoch.
    pub time_ms: u64,
    /// The spout instance that wrote it.
    pub spout_id: String,
    /// Byte offset in the data file up to which every record was emitted.
    pub offset: u64,
}

impl LogEntry {
    /// Parses `<epoch-millis>,<spout-id>,<offset>`. The id is everything
    /// between the first and the last comma, so an id with commas in it
    /// (which the CLI refuses anyway) cannot shift the offset.
    pub fn parse(line: &str) -> Option<LogEntry> {
        let line = line.trim_end_matches('\r');
        let (time, rest) = line.split_once(',')?;
        let (id, offset) = rest.rsplit_once(',')?;
        Some(LogEntry {
            time_ms: time.trim().parse().ok()?,
            spout_id: id.to_string(),
            offset: offset.trim().parse().ok()?,
        })
    }

    /// The line as written to the lock file, newline included.
    pub fn to_line(&self) -> String {
        format!("{},{},{}\n", self.time_ms, self.spout_id, self.offset)
    }
}

/// The last complete, well-formed entry of a lock file's contents. A last
/// line without its newline is a write that never completed and is
/// ignored; so are lines that do not parse. An empty or wholly garbled
/// lock file has no entry (Storm crashed on that: STORM-2356).
pub fn parse_last_entry(bytes: &[u8]) -> Option<LogEntry> {
    let end = bytes.iter().rposition(|&b| b == b'\n')?;
    bytes[..end]
        .split(|&b| b == b'\n')
        .rev()
        .filter_map(|l| std::str::from_utf8(l).ok())
        .find_map(LogEntry::parse)
}

/// Reads the last entry of a lock file through a read-only descriptor,
/// which leasefs never delays: the visible length covers every
/// acknowledged (fsynced) entry of a writer that still holds the file.
pub fn read_last_entry(path: &Path) -> std::io::Result<Option<LogEntry>> {
    let mut f = File::open(path)?;
    let len = f.metadata()?.len();
    let start = len.saturating_sub(TAIL_BYTES);
    f.seek(SeekFrom::Start(start))?;
    let mut buf = Vec::new();
    f.read_to_end(&mut buf)?;
    if start > 0 {
        // Started inside a line: drop its tail, it could parse wrongly.
        match buf.iter().position(|&b| b == b'\n') {
            Some(i) => {
                buf.drain(..=i);
            }
            None => return Ok(None),
        }
    }
    Ok(parse_last_entry(&buf))
}

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

/// Milliseconds since the Unix epoch of a file's modification time.
fn mtime_ms(meta: &std::fs::Metadata) -> u64 {
    (meta.mtime().max(0) as u64) * 1000 + (meta.mtime_nsec().max(0) as u64) / 1_000_000
}

/// Storm's rule for an idle lock: modified no later than `now - timeout`.
fn idle(mtime_ms: u64, now_ms: u64, timeout: Duration) -> bool {
    mtime_ms <= now_ms.saturating_sub(timeout.as_millis() as u64)
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
}

/// What came of trying to take over an idle lock file.
#[derive(Debug)]
pub enum TakeOver {
    /// Taken: resume at `resume_from` (offset 0 when the lock file held
    /// no entry). `previous` is the entry the last owner left.
    Taken {
        lock: FileLock,
        resume_from: u64,
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
            Err(e)
                if e.kind() == std::io::ErrorKind::AlreadyExists || is_errno(&e, libc::EBUSY) =>
            {
                return Ok(None);
            }
            Err(e) => return Err(e.into()),
        };
        let lease = match renewer.adopt(file) {
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
        };
        if let Err(e) = lock.commit(0, now_ms) {
            let _ = lock.release();
            return Err(e);
        }
        Ok(Some(lock))
    }

    /// Takes over `path` if it has been idle for `timeout` (its mtime and
    /// its last entry's time both at or before `now - timeout`, Storm's
    /// rule) **and** its lease can be had: the open for append succeeds
    /// only once the owner released it or stopped renewing for the mount's
    /// soft limit (the daemon recovers the file first).
    pub fn take_over(
        renewer: &Renewer,
        path: &Path,
        spout_id: &str,
        timeout: Duration,
        now_ms: u64,
    ) -> Result<TakeOver, LockError> {
        let meta = match std::fs::metadata(path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(TakeOver::Gone),
            Err(e) => return Err(e.into()),
        };
        if !idle(mtime_ms(&meta), now_ms, timeout) {
            return Ok(TakeOver::NotIdle);
        }
        match read_last_entry(path) {
            Ok(Some(e)) if !idle(e.time_ms, now_ms, timeout) => return Ok(TakeOver::NotIdle),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(TakeOver::Gone),
            Err(e) => return Err(e.into()),
        }
        let file = match OpenOptions::new().append(true).open(path) {
            Ok(f) => f,
            Err(e) if is_errno(&e, libc::EBUSY) => return Ok(TakeOver::Held),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(TakeOver::Gone),
            Err(e) => return Err(e.into()),
        };
        let lease = renewer.adopt(file).map_err(LockError::NoClientRenewal)?;
        // The lease is ours now and the old owner is fenced: what the file
        // holds at this point is final, so read the entry to resume from
        // again (the owner may have committed between our checks).
        let previous = read_last_entry(path)?;
        let resume_from = previous.as_ref().map_or(0, |e| e.offset);
        let lock = FileLock {
            path: path.to_path_buf(),
            spout_id: spout_id.to_string(),
            lease,
        };
        lock.commit(resume_from, now_ms)?;
        Ok(TakeOver::Taken {
            lock,
            resume_from,
            previous,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records progress: one `write` of one whole line, then `fsync`, so
    /// the entry is on every replica before the caller goes on. `EIO`
    /// means the lease was preempted (fenced).
    pub fn commit(&self, offset: u64, now_ms: u64) -> Result<(), LockError> {
        if self.lease.is_lost() {
            return Err(LockError::Lost);
        }
        let line = LogEntry {
            time_ms: now_ms,
            spout_id: self.spout_id.clone(),
            offset,
        }
        .to_line();
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
            Ok(()) => Ok(()),
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
    /// older than `timeout` and with a lease that was released or expired
    /// (its owner died or stopped mid-scan). `Ok(None)` when another
    /// instance holds it.
    pub fn acquire(
        renewer: &Renewer,
        lock_dir: &Path,
        timeout: Duration,
        now_ms: u64,
    ) -> Result<Option<DirLock>, LockError> {
        let path = lock_dir.join(DIRLOCK);
        let opened = OpenOptions::new()
            .append(true)
            .create_new(true)
            .mode(0o644)
            .open(&path);
        let file = match opened {
            Ok(f) => f,
            Err(e)
                if e.kind() == std::io::ErrorKind::AlreadyExists || is_errno(&e, libc::EBUSY) =>
            {
                match Self::open_stale(&path, timeout, now_ms)? {
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
    fn open_stale(path: &Path, timeout: Duration, now_ms: u64) -> Result<Option<File>, LockError> {
        match std::fs::metadata(path) {
            Ok(m) if idle(mtime_ms(&m), now_ms, timeout) => {}
            Ok(_) => return Ok(None),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e.into()),
        }
        let file = match OpenOptions::new().append(true).open(path) {
            Ok(f) => f,
            Err(e) if is_errno(&e, libc::EBUSY) || e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(None);
            }
            Err(e) => return Err(e.into()),
        };
        // The name may have been replaced by a fresh DIRLOCK between the
        // stat and the open; only a stale one may be taken.
        if !idle(mtime_ms(&file.metadata()?), now_ms, timeout) {
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

/// Lock files of `lock_dir` (DIRLOCK excluded) with their mtimes, oldest
/// first.
pub fn list_lock_files(lock_dir: &Path) -> std::io::Result<Vec<(PathBuf, u64)>> {
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
            out.push((entry.path(), mtime_ms(&meta)));
        }
    }
    out.sort_by(|a, b| a.1.cmp(&b.1).then_with(|| a.0.cmp(&b.0)));
    Ok(out)
}

/// Whether `lock_dir` has a lock file idle by mtime, the cheap test that
/// decides whether a scan under DIRLOCK is worth it.
pub fn any_idle(locks: &[(PathBuf, u64)], now_ms: u64, timeout: Duration) -> bool {
    locks.iter().any(|(_, m)| idle(*m, now_ms, timeout))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_an_entry() {
        let e = LogEntry::parse("1700000000123,spout-a,4096").unwrap();
        assert_eq!(e.time_ms, 1_700_000_000_123);
        assert_eq!(e.spout_id, "spout-a");
        assert_eq!(e.offset, 4096);
        assert_eq!(e.to_line(), "1700000000123,spout-a,4096\n");
        assert_eq!(
            LogEntry::parse(&e.to_line()[..e.to_line().len() - 1]),
            Some(e)
        );
    }

    #[test]
    fn id_with_colons_and_commas_keeps_offset() {
        let e = LogEntry::parse("5,host:12,x,77").unwrap();
        assert_eq!(e.spout_id, "host:12,x");
        assert_eq!(e.offset, 77);
    }

    #[test]
    fn rejects_malformed_entries() {
        for l in [
            "",
            "abc",
            "1,2",
            "x,id,3",
            "1,id,",
            "1,id,-5",
            "1,id,{char=5:line=1:}",
        ] {
            assert_eq!(LogEntry::parse(l), None, "{l:?}");
        }
    }

    #[test]
    fn last_complete_entry_wins() {
        let b = b"1,a,0\n2,a,10\n3,b,20\n";
        assert_eq!(parse_last_entry(b).unwrap().offset, 20);
    }

    #[test]
    fn truncated_last_line_is_ignored() {
        let b = b"1,a,0\n2,a,10\n3,b,2";
        let e = parse_last_entry(b).unwrap();
        assert_eq!((e.time_ms, e.offset), (2, 10));
    }

    #[test]
    fn empty_or_garbled_lock_file_has_no_entry() {
        assert_eq!(parse_last_entry(b""), None);
        assert_eq!(parse_last_entry(b"12,a,"), None);
        assert_eq!(parse_last_entry(b"\0\0\0\n"), None);
        assert_eq!(parse_last_entry(b"garbage\n"), None);
    }

    #[test]
    fn garbled_line_falls_back_to_the_previous_entry() {
        let b = b"1,a,0\n2,a,10\n\xff\xfe\n\n";
        assert_eq!(parse_last_entry(b).unwrap().offset, 10);
    }

    #[test]
    fn storm_written_log_without_final_newline_resumes_earlier() {
        // Storm writes the newline before each entry but the first, so its
        // last entry has none: taken as possibly truncated, it is skipped
        // and the previous one used (more duplicates, never a lost record).
        let b = b"1,a,0\n2,a,10";
        assert_eq!(parse_last_entry(b).unwrap().offset, 0);
    }

    #[test]
    fn idle_is_storms_at_or_before() {
        let t = Duration::from_secs(3);
        assert!(idle(7_000, 10_000, t));
        assert!(!idle(7_001, 10_000, t));
        // Shortly after the epoch (a fake clock) nothing underflows.
        assert!(idle(0, 1_000, t));
    }

    #[test]
    fn read_last_entry_of_a_long_log_reads_only_the_tail() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("lock");
        let mut s = String::new();
        for i in 0..10_000u64 {
            s.push_str(
                &LogEntry {
                    time_ms: i,
                    spout_id: "s".into(),
                    offset: i * 10,
                }
                .to_line(),
            );
        }
        s.push_str("99999,s,12");
        std::fs::write(&p, s).unwrap();
        let e = read_last_entry(&p).unwrap().unwrap();
        assert_eq!(e.offset, 99_990);
        std::fs::write(&p, "").unwrap();
        assert_eq!(read_last_entry(&p).unwrap(), None);
    }
}
