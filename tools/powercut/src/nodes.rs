//! The inodes, open files and helpers of the passthrough: every inode
//! the kernel knows is held by an `O_PATH` descriptor (as libfuse's
//! passthrough_hp holds them), so a rename or an unlink never leaves a
//! stale path, and every change goes through the [`Journal`].

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Generation, INodeNo, ReplyEntry, Request, TimeOrNow,
};
use nix::fcntl::{AtFlags, OFlag, openat};
use nix::sys::stat::{FileStat, Mode, fstat};
use nix::unistd::{Gid, Uid, fchownat};

use crate::journal::{Change, DirFd, Journal, Key, io_err, reopen};

pub(crate) const TTL: Duration = Duration::from_secs(1);

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What the control socket and the filesystem share.
pub struct Shared {
    pub journal: Journal,
    /// `true` once the power is cut.
    pub cut: RwLock<bool>,
    /// Injected faults: top-level directory name -> errno of its changes
    /// (and whether only its fsyncs fail).
    pub faults: Mutex<HashMap<OsString, (i32, bool)>>,
    /// Slowed directories: top-level directory name -> how late each
    /// write under it is answered.
    pub slow: Mutex<HashMap<OsString, Duration>>,
    /// Sends the late answers.
    pub late: crate::delay::Delayer,
}

impl Shared {
    /// Cuts the power: waits for requests in flight, drops every pending
    /// change, and fails every later request.
    pub fn cut(&self, subset: Option<crate::journal::Subset>) -> crate::journal::CutReport {
        let mut cut = self.cut.write().unwrap_or_else(|e| e.into_inner());
        *cut = true;
        self.journal.cut(subset)
    }
}

/// One inode the kernel knows.
pub(crate) struct Node {
    pub(crate) fd: DirFd,
    pub(crate) key: Key,
    /// The top-level directory it lives under (where faults are injected).
    pub(crate) domain: Option<OsString>,
    pub(crate) lookups: AtomicU64,
}

#[derive(Default)]
pub(crate) struct Nodes {
    pub(crate) by_ino: HashMap<u64, Arc<Node>>,
    pub(crate) by_key: HashMap<Key, u64>,
    pub(crate) next: u64,
}

pub(crate) struct OpenFile {
    pub(crate) file: File,
    pub(crate) node: Arc<Node>,
    /// Opened `O_SYNC`/`O_DSYNC`: every write is durable when it returns.
    pub(crate) sync_writes: bool,
}

/// A directory's entries as read at opendir: (name, inode, type).
pub(crate) type Listing = Vec<(OsString, u64, FileType)>;

pub struct PowerCut {
    pub(crate) shared: Arc<Shared>,
    pub(crate) nodes: Mutex<Nodes>,
    pub(crate) files: Mutex<HashMap<u64, Arc<OpenFile>>>,
    pub(crate) dirs: Mutex<HashMap<u64, Arc<Listing>>>,
    pub(crate) next_fh: AtomicU64,
}

pub(crate) fn errno(e: &io::Error) -> Errno {
    Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO))
}

pub(crate) fn kind(mode: u32) -> FileType {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFSOCK => FileType::Socket,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        _ => FileType::RegularFile,
    }
}

pub(crate) fn time(s: i64, ns: i64) -> SystemTime {
    if s >= 0 {
        UNIX_EPOCH + Duration::new(s as u64, ns as u32)
    } else {
        UNIX_EPOCH - Duration::from_secs(s.unsigned_abs())
    }
}

pub(crate) fn timespec(t: Option<TimeOrNow>) -> nix::sys::time::TimeSpec {
    use nix::sys::time::TimeSpec;
    match t {
        None => TimeSpec::UTIME_OMIT,
        Some(TimeOrNow::Now) => TimeSpec::UTIME_NOW,
        Some(TimeOrNow::SpecificTime(t)) => match t.duration_since(UNIX_EPOCH) {
            Ok(d) => TimeSpec::from_duration(d),
            Err(_) => TimeSpec::new(0, 0),
        },
    }
}

pub(crate) fn proc_path(fd: &OwnedFd) -> String {
    format!("/proc/self/fd/{}", fd.as_raw_fd())
}

/// The descriptor flags a backing file is opened with: the access mode
/// only. Appends come with the offset the kernel computed, and truncation
/// arrives as a size change.
pub(crate) fn open_flags(flags: i32) -> i32 {
    flags & libc::O_ACCMODE
}

impl PowerCut {
    /// Serves `root` (a directory of the backing filesystem).
    pub fn new(root: &Path, shared: Arc<Shared>) -> io::Result<PowerCut> {
        let fd = nix::fcntl::open(
            root,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(io_err)?;
        let st = fstat(&fd).map_err(io_err)?;
        let key = (st.st_dev, st.st_ino);
        let root = Arc::new(Node {
            fd: Arc::new(fd),
            key,
            domain: None,
            lookups: AtomicU64::new(1),
        });
        let mut nodes = Nodes {
            next: 2,
            ..Nodes::default()
        };
        nodes.by_ino.insert(1, root);
        nodes.by_key.insert(key, 1);
        Ok(PowerCut {
            shared,
            nodes: Mutex::new(nodes),
            files: Mutex::default(),
            dirs: Mutex::default(),
            next_fh: AtomicU64::new(1),
        })
    }

    /// The power lock, for reading: `EIO` once the power is cut.
    pub(crate) fn power(&self) -> Result<RwLockReadGuard<'_, bool>, Errno> {
        let g = self.shared.cut.read().unwrap_or_else(|e| e.into_inner());
        if *g {
            return Err(Errno::EIO);
        }
        Ok(g)
    }

    pub(crate) fn node(&self, ino: INodeNo) -> Result<Arc<Node>, Errno> {
        lock(&self.nodes)
            .by_ino
            .get(&ino.0)
            .cloned()
            .ok_or(Errno::ESTALE)
    }

    pub(crate) fn file(&self, fh: FileHandle) -> Result<Arc<OpenFile>, Errno> {
        lock(&self.files).get(&fh.0).cloned().ok_or(Errno::EBADF)
    }

    /// The injected error of changes below `node`'s top-level directory.
    pub(crate) fn fault(&self, node: &Node) -> Result<(), Errno> {
        match self.injected(node) {
            Some((e, false)) => Err(Errno::from_i32(e)),
            _ => Ok(()),
        }
    }

    /// The injected error of fsyncs below `node`'s top-level directory:
    /// a fault of every change with `EIO`, or one of fsyncs only.
    pub(crate) fn sync_fault(&self, node: &Node) -> Result<(), Errno> {
        match self.injected(node) {
            Some((e, true)) => Err(Errno::from_i32(e)),
            Some((libc::EIO, false)) => Err(Errno::EIO),
            _ => Ok(()),
        }
    }

    /// How late a write below `node`'s top-level directory is answered.
    pub(crate) fn slowed(&self, node: &Node) -> Option<Duration> {
        let d = node.domain.as_ref()?;
        lock(&self.shared.slow).get(d).copied()
    }

    pub(crate) fn injected(&self, node: &Node) -> Option<(i32, bool)> {
        let d = node.domain.as_ref()?;
        lock(&self.shared.faults).get(d).copied()
    }

    pub(crate) fn attr(&self, ino: u64, key: Key, st: &FileStat) -> FileAttr {
        let trash = self.shared.journal.trash_links(key);
        FileAttr {
            ino: INodeNo(ino),
            size: st.st_size as u64,
            blocks: st.st_blocks as u64,
            atime: time(st.st_atime, st.st_atime_nsec),
            mtime: time(st.st_mtime, st.st_mtime_nsec),
            ctime: time(st.st_ctime, st.st_ctime_nsec),
            crtime: time(st.st_ctime, st.st_ctime_nsec),
            kind: kind(st.st_mode),
            perm: (st.st_mode & 0o7777) as u16,
            nlink: (st.st_nlink as u32).saturating_sub(trash),
            uid: st.st_uid,
            gid: st.st_gid,
            rdev: st.st_rdev as u32,
            blksize: st.st_blksize as u32,
            flags: 0,
        }
    }

    /// Looks `name` up in `parent`, counting one kernel reference.
    pub(crate) fn lookup_in(
        &self,
        parent: &Node,
        name: &OsStr,
    ) -> io::Result<(u64, Arc<Node>, FileStat)> {
        let fd = openat(
            parent.fd.as_fd(),
            name,
            OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(io_err)?;
        let st = fstat(&fd).map_err(io_err)?;
        let key = (st.st_dev, st.st_ino);
        let mut nodes = lock(&self.nodes);
        if let Some(&ino) = nodes.by_key.get(&key)
            && let Some(n) = nodes.by_ino.get(&ino)
        {
            n.lookups.fetch_add(1, Ordering::Relaxed);
            return Ok((ino, n.clone(), st));
        }
        let ino = nodes.next;
        nodes.next += 1;
        let domain = match &parent.domain {
            Some(d) => Some(d.clone()),
            None => Some(name.to_owned()),
        };
        let n = Arc::new(Node {
            fd: Arc::new(fd),
            key,
            domain,
            lookups: AtomicU64::new(1),
        });
        nodes.by_ino.insert(ino, n.clone());
        nodes.by_key.insert(key, ino);
        Ok((ino, n, st))
    }

    pub(crate) fn entry(&self, parent: &Node, name: &OsStr, reply: ReplyEntry) {
        match self.lookup_in(parent, name) {
            Ok((ino, n, st)) => reply.entry(&TTL, &self.attr(ino, n.key, &st), Generation(0)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    pub(crate) fn owner(&self, dir: &Node, name: &OsStr, req: &Request) -> io::Result<()> {
        fchownat(
            dir.fd.as_fd(),
            name,
            Some(Uid::from_raw(req.uid())),
            Some(Gid::from_raw(req.gid())),
            AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .map_err(io_err)
    }

    pub(crate) fn register(&self, file: File, node: Arc<Node>, flags: i32) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        let sync_writes = flags & (libc::O_SYNC | libc::O_DSYNC) != 0;
        lock(&self.files).insert(
            fh,
            Arc::new(OpenFile {
                file,
                node,
                sync_writes,
            }),
        );
        fh
    }

    /// Changes a file's size through the journal.
    pub(crate) fn set_len(&self, node: &Node, file: Option<&File>, size: u64) -> io::Result<()> {
        self.shared
            .journal
            .modify(node.key, &node.fd, Change::SetLen(size), || match file {
                Some(f) => f.set_len(size),
                None => reopen(&node.fd, libc::O_WRONLY)?.set_len(size),
            })
    }

    pub(crate) fn read_dir(&self, node: &Node) -> io::Result<Listing> {
        let fd = openat(
            node.fd.as_fd(),
            ".",
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(io_err)?;
        let mut dir = nix::dir::Dir::from_fd(fd).map_err(io_err)?;
        let mut out = Vec::new();
        for e in dir.iter() {
            let e = e.map_err(io_err)?;
            let k = match e.file_type() {
                Some(nix::dir::Type::Directory) => FileType::Directory,
                Some(nix::dir::Type::Symlink) => FileType::Symlink,
                Some(nix::dir::Type::Fifo) => FileType::NamedPipe,
                Some(nix::dir::Type::Socket) => FileType::Socket,
                Some(nix::dir::Type::CharacterDevice) => FileType::CharDevice,
                Some(nix::dir::Type::BlockDevice) => FileType::BlockDevice,
                _ => FileType::RegularFile,
            };
            let name = OsStr::from_bytes(e.file_name().to_bytes()).to_owned();
            out.push((name, e.ino(), k));
        }
        Ok(out)
    }
}
