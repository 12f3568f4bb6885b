//! The election file `ELECTION_DIR/LEADER`: the descriptor whose write lease
//! is leadership, the one JSON line each leader appends, and the lease as the
//! `user.leasefs.lease` xattr shows it to followers.
//!
//! The descriptor speaks to the daemon through the ioctls of
//! docs/SEMANTICS.md ("Leases"): client renewal, renew, epoch. All fail with
//! `EIO` once the lease was preempted, which is how a leader learns that it
//! was fenced.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// `_IO('L', 1)`: this descriptor's lease is renewed by the caller from now on.
const IOC_CLIENT_RENEWAL: u64 = 0x4C01;
/// `_IO('L', 2)`: renew now.
const IOC_RENEW: u64 = 0x4C02;
/// `_IOR('L', 3, u64)`: the epoch of this descriptor's grant.
const IOC_EPOCH: u64 = 0x8008_4C03;
/// `_IOR('L', 4, u64)`: renew now; for how many ms the lease is vouched for.
const IOC_RENEW_VALID: u64 = 0x8008_4C04;

/// How much of the election file's end a follower reads to find the last
/// record: a record is one short JSON line (a few hundred bytes), and any
/// leader may append what it likes, so the file's size says nothing.
const RECORD_TAIL: usize = 64 * 1024;

/// How an attempt to become leader ended without an error worth stopping for.
#[derive(Debug)]
pub enum OpenError {
    /// Someone else holds the lease (`EBUSY`): follow.
    Busy,
    /// A failure that may pass (the lease's recovery failed, an interrupted
    /// open, a daemon being restarted): log it and try again later.
    Transient(io::Error),
    /// Anything else (no such directory, not a leasefs mount, permissions).
    Fatal(io::Error),
}

/// An open write descriptor on the election file: holding it open is
/// holding leadership, closing it hands the lease on at once.
#[derive(Debug)]
pub struct LeaderFile {
    /// Shared with the renewal thread: the descriptor is closed (and the
    /// lease handed on) when the last of them lets go.
    file: Arc<File>,
    path: PathBuf,
}

impl LeaderFile {
    /// Tries to take the election file's write lease without waiting:
    /// `O_NONBLOCK` makes a held lease an immediate `EBUSY` even on mounts
    /// with `lease_wait`, so a follower's polling cadence is its own.
    /// `O_CLOEXEC` (always set by std) keeps the descriptor out of the
    /// leader's command, whose process must not hold the lease.
    pub fn open(path: &Path) -> Result<LeaderFile, OpenError> {
        let r = OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o644)
            .custom_flags(libc::O_NONBLOCK)
            .open(path);
        let file = match r {
            Ok(f) => f,
            Err(e) => {
                return Err(match e.raw_os_error() {
                    Some(libc::EBUSY) | Some(libc::EAGAIN) => OpenError::Busy,
                    Some(libc::EINTR) | Some(libc::EIO) | Some(libc::ENOTCONN) => {
                        OpenError::Transient(e)
                    }
                    _ => OpenError::Fatal(e),
                });
            }
        };
        // Writes and ioctls should simply block; non-blocking was for the open.
        set_blocking(&file);
        Ok(LeaderFile {
            file: Arc::new(file),
            path: path.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    /// Switches the lease to client renewal: from now on it lives only as
    /// long as this process renews it.
    pub fn client_renewal(&self) -> io::Result<()> {
        ioctl(self.raw_fd(), IOC_CLIENT_RENEWAL, None)
    }

    /// The descriptor, for a thread that renews through it.
    pub fn shared(&self) -> Arc<File> {
        self.file.clone()
    }

    /// Renews, and says for how long the daemon vouches for the lease.
    pub fn renew_valid(&self) -> io::Result<Option<std::time::Duration>> {
        renew_valid(&self.file)
    }

    /// The epoch of this descriptor's grant: the term's fencing token.
    /// Also a renewal-free check that the lease is still ours.
    pub fn epoch(&self) -> io::Result<u64> {
        let mut buf = [0u8; 8];
        ioctl(self.raw_fd(), IOC_EPOCH, Some(&mut buf))?;
        Ok(u64::from_le_bytes(buf))
    }

    /// Appends one record line and makes it durable, so that the next
    /// leader reads it even if this one dies right after.
    pub fn append_record(&mut self, rec: &LeaderRecord) -> io::Result<()> {
        let mut line = serde_json::to_vec(rec).map_err(io::Error::other)?;
        line.push(b'\n');
        (&*self.file).write_all(&line)?;
        self.file.sync_all()
    }
}

/// Renews the lease of `file` and answers for how long from the call the
/// daemon vouches that no one else can be granted it (`None` from a daemon
/// that does not say: then only `IOC_RENEW` is sent).
pub fn renew_valid(file: &File) -> io::Result<Option<std::time::Duration>> {
    let mut buf = [0u8; 8];
    match ioctl(file.as_raw_fd(), IOC_RENEW_VALID, Some(&mut buf)) {
        Ok(()) => Ok(Some(std::time::Duration::from_millis(u64::from_le_bytes(
            buf,
        )))),
        // A daemon that does not know it (an older release).
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::ENOTTY)
                    | Some(libc::ENOSYS)
                    | Some(libc::EOPNOTSUPP)
                    | Some(libc::EINVAL)
            ) =>
        {
            ioctl(file.as_raw_fd(), IOC_RENEW, None).map(|()| None)
        }
        Err(e) => Err(e),
    }
}

/// `ioctl(2)` on the election file's descriptor, with an optional 8-byte
/// buffer for `_IOR` requests.
fn ioctl(fd: RawFd, request: u64, out: Option<&mut [u8; 8]>) -> io::Result<()> {
    let arg = out.map_or(std::ptr::null_mut(), |b| b.as_mut_ptr());
    // SAFETY: `fd` is an open descriptor owned by the caller; the argument is
    // either null (requests without data) or an 8-byte buffer that outlives
    // the call, as `_IOR('L', 3, u64)` needs.
    let r = unsafe { libc::ioctl(fd, request as libc::Ioctl, arg) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn set_blocking(file: &File) {
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    if let Ok(bits) = fcntl(file, FcntlArg::F_GETFL) {
        let flags = OFlag::from_bits_truncate(bits) & !OFlag::O_NONBLOCK;
        let _ = fcntl(file, FcntlArg::F_SETFL(flags));
    }
}

/// What a leader writes about itself into the election file, one JSON line
/// per term.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaderRecord {
    pub id: String,
    pub host: String,
    /// The elector's pid (the lease holder).
    pub pid: u32,
    pub epoch: u64,
    pub time_ms: u64,
    /// The command's process group (and session), when there is a command.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pgid: Option<u32>,
    /// The command's cgroup, when it got one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
}

/// The last well-formed record of the election file (`None` for a new
/// election). Reading never touches the lease.
pub fn last_record(path: &Path) -> io::Result<Option<LeaderRecord>> {
    match File::open(path) {
        Ok(mut f) => last_record_in(&mut f),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// [`last_record`] of an open election file: only its last
/// [`RECORD_TAIL`] bytes are read, lines that are not a record (torn,
/// not text, cut at the start of the tail) are passed over.
fn last_record_in(f: &mut (impl Read + io::Seek)) -> io::Result<Option<LeaderRecord>> {
    let len = f.seek(io::SeekFrom::End(0))?;
    let start = len.saturating_sub(RECORD_TAIL as u64);
    f.seek(io::SeekFrom::Start(start))?;
    let mut tail = Vec::with_capacity((len - start) as usize);
    f.take(RECORD_TAIL as u64).read_to_end(&mut tail)?;
    let mut lines: Vec<&[u8]> = tail.split(|b| *b == b'\n').collect();
    if start > 0 && !lines.is_empty() {
        // The tail starts inside a line.
        lines.remove(0);
    }
    Ok(lines
        .into_iter()
        .rev()
        .find_map(|l| serde_json::from_slice::<LeaderRecord>(l).ok()))
}

/// The election file's lease as `user.leasefs.lease` shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct LeaseView {
    pub state: String,
    /// `host:pid` of the holder.
    #[serde(default)]
    pub holder: Option<String>,
    #[serde(default)]
    pub epoch: u64,
    /// `daemon` or `client`.
    #[serde(default)]
    pub mode: Option<String>,
    #[serde(default)]
    pub renewed_ms_ago: Option<u64>,
}

impl LeaseView {
    /// The lease of `path`, or `None` when the file does not exist yet or
    /// the xattr cannot be read.
    pub fn read(path: &Path) -> Option<LeaseView> {
        let raw = getxattr(path, "user.leasefs.lease").ok()?;
        serde_json::from_slice(&raw).ok()
    }

    pub fn is_held(&self) -> bool {
        self.state == "held"
    }

    /// Held under client renewal and, `since_read` after this view was
    /// taken, unrenewed for at least `lease`: takeable by a follower.
    pub fn looks_expired(&self, lease_ms: u64, since_read_ms: u64) -> bool {
        self.is_held()
            && self.mode.as_deref() == Some("client")
            && self
                .renewed_ms_ago
                .is_some_and(|r| r.saturating_add(since_read_ms) >= lease_ms)
    }
}

/// The soft limit the mount at `mountpoint` enforces (its root's
/// `user.leasefs.soft_limit_ms`); `None` from a daemon that does not show it.
pub fn mount_soft_limit(mountpoint: &Path) -> Option<std::time::Duration> {
    let raw = getxattr(mountpoint, "user.leasefs.soft_limit_ms").ok()?;
    let ms: u64 = std::str::from_utf8(&raw).ok()?.trim().parse().ok()?;
    Some(std::time::Duration::from_millis(ms))
}

fn getxattr(path: &Path, name: &str) -> io::Result<Vec<u8>> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let p = CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
    let n = CString::new(name).map_err(io::Error::other)?;
    let mut buf = vec![0u8; 4096];
    // SAFETY: valid NUL-terminated strings and a buffer of the stated length.
    let r = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(r as usize);
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_the_last_good_line_wins() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("LEADER");
        assert_eq!(last_record(&p).expect("read"), None);
        let a = LeaderRecord {
            id: "a".into(),
            host: "h".into(),
            pid: 1,
            epoch: 3,
            time_ms: 10,
            pgid: Some(7),
            cgroup: None,
        };
        let b = LeaderRecord {
            id: "b".into(),
            epoch: 5,
            pgid: None,
            ..a.clone()
        };
        let text = format!(
            "{}\n{}\n{{\"torn",
            serde_json::to_string(&a).expect("json"),
            serde_json::to_string(&b).expect("json")
        );
        std::fs::write(&p, text).expect("write");
        assert_eq!(last_record(&p).expect("read"), Some(b));
    }

    /// A reader that counts the bytes it hands out.
    struct Counted<R>(R, u64);

    impl<R: Read> Read for Counted<R> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = self.0.read(buf)?;
            self.1 += n as u64;
            Ok(n)
        }
    }

    impl<R: io::Seek> io::Seek for Counted<R> {
        fn seek(&mut self, pos: io::SeekFrom) -> io::Result<u64> {
            self.0.seek(pos)
        }
    }

    /// Any leader may write what it likes into the election file: a
    /// follower, which looks at its last record at every retry, reads
    /// only its tail, whatever the file holds before it (bytes that are
    /// not text included), and finds the last record there.
    #[test]
    fn a_bloated_election_file_costs_a_follower_only_its_tail() {
        let rec = LeaderRecord {
            id: "late".into(),
            host: "h".into(),
            pid: 9,
            epoch: 40,
            time_ms: 1,
            pgid: None,
            cgroup: None,
        };
        let mut bytes = vec![0xffu8; 8 << 20];
        bytes.extend_from_slice(b"\n");
        bytes.extend_from_slice(&serde_json::to_vec(&rec).expect("json"));
        bytes.extend_from_slice(b"\n");
        let mut f = Counted(io::Cursor::new(bytes), 0);
        assert_eq!(last_record_in(&mut f).expect("read"), Some(rec));
        assert!(
            f.1 <= RECORD_TAIL as u64,
            "read {} bytes of an election file to find its last record",
            f.1
        );
    }

    #[test]
    fn a_lease_looks_expired_only_when_client_renewed_and_old_enough() {
        let v: LeaseView = serde_json::from_str(
            r#"{"state":"held","holder":"h:1","comm":"leasefs","epoch":4,"mode":"client","renewed_ms_ago":1800,"waiters":0}"#,
        )
        .expect("parse");
        assert!(!v.looks_expired(2000, 100));
        assert!(v.looks_expired(2000, 200));
        let daemon = LeaseView {
            mode: Some("daemon".into()),
            ..v.clone()
        };
        assert!(!daemon.looks_expired(2000, 5000));
        let free: LeaseView = serde_json::from_str(r#"{"state":"free","epoch":4}"#).expect("parse");
        assert!(!free.looks_expired(2000, 5000));
    }
}
