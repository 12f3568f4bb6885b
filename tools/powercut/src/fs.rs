//! The FUSE side: a passthrough over `BACKING/root` in the style of
//! libfuse's passthrough_hp (every inode held by an `O_PATH` descriptor, so
//! renames and unlinks never leave a stale path), whose changes go through
//! the [`Journal`] so that a cut can drop those not yet durable.
//!
//! POSIX record locks and `flock` are left to the kernel (no lock
//! capability is negotiated, so they work locally, as SQLite needs), and
//! so are FIFOs and sockets once created. Extended attributes are not
//! supported. Every request holds the power lock for reading; a cut takes
//! it for writing, so no change lands after it, and from then on every
//! request fails with `EIO`.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    KernelConfig, LockOwner, OpenFlags, RenameFlags as FuseRenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request,
    TimeOrNow, WriteFlags,
};
use nix::fcntl::{AtFlags, OFlag, RenameFlags, openat};
use nix::sys::stat::{FileStat, Mode, SFlag, fstat, mkdirat, mknodat};
use nix::unistd::{Gid, Uid, fchownat, linkat, symlinkat};

use crate::journal::{Change, DirFd, Journal, Key, io_err, reopen};

const TTL: Duration = Duration::from_secs(1);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
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
}

impl Shared {
    /// Cuts the power: waits for requests in flight, drops every pending
    /// change, and fails every later request.
    pub fn cut(&self) -> crate::journal::CutReport {
        let mut cut = self.cut.write().unwrap_or_else(|e| e.into_inner());
        *cut = true;
        self.journal.cut()
    }
}

/// One inode the kernel knows.
struct Node {
    fd: DirFd,
    key: Key,
    /// The top-level directory it lives under (where faults are injected).
    domain: Option<OsString>,
    lookups: AtomicU64,
}

#[derive(Default)]
struct Nodes {
    by_ino: HashMap<u64, Arc<Node>>,
    by_key: HashMap<Key, u64>,
    next: u64,
}

struct OpenFile {
    file: File,
    node: Arc<Node>,
    /// Opened `O_SYNC`/`O_DSYNC`: every write is durable when it returns.
    sync_writes: bool,
}

/// A directory's entries as read at opendir: (name, inode, type).
type Listing = Vec<(OsString, u64, FileType)>;

pub struct PowerCut {
    shared: Arc<Shared>,
    nodes: Mutex<Nodes>,
    files: Mutex<HashMap<u64, Arc<OpenFile>>>,
    dirs: Mutex<HashMap<u64, Arc<Listing>>>,
    next_fh: AtomicU64,
}

fn errno(e: &io::Error) -> Errno {
    Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO))
}

fn kind(mode: u32) -> FileType {
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

fn time(s: i64, ns: i64) -> SystemTime {
    if s >= 0 {
        UNIX_EPOCH + Duration::new(s as u64, ns as u32)
    } else {
        UNIX_EPOCH - Duration::from_secs(s.unsigned_abs())
    }
}

fn timespec(t: Option<TimeOrNow>) -> nix::sys::time::TimeSpec {
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

fn proc_path(fd: &OwnedFd) -> String {
    format!("/proc/self/fd/{}", fd.as_raw_fd())
}

/// The descriptor flags a backing file is opened with: the access mode
/// only. Appends come with the offset the kernel computed, and truncation
/// arrives as a size change.
fn open_flags(flags: i32) -> i32 {
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
    fn power(&self) -> Result<RwLockReadGuard<'_, bool>, Errno> {
        let g = self.shared.cut.read().unwrap_or_else(|e| e.into_inner());
        if *g {
            return Err(Errno::EIO);
        }
        Ok(g)
    }

    fn node(&self, ino: INodeNo) -> Result<Arc<Node>, Errno> {
        lock(&self.nodes)
            .by_ino
            .get(&ino.0)
            .cloned()
            .ok_or(Errno::ESTALE)
    }

    fn file(&self, fh: FileHandle) -> Result<Arc<OpenFile>, Errno> {
        lock(&self.files).get(&fh.0).cloned().ok_or(Errno::EBADF)
    }

    /// The injected error of changes below `node`'s top-level directory.
    fn fault(&self, node: &Node) -> Result<(), Errno> {
        match self.injected(node) {
            Some((e, false)) => Err(Errno::from_i32(e)),
            _ => Ok(()),
        }
    }

    /// The injected error of fsyncs below `node`'s top-level directory:
    /// a fault of every change with `EIO`, or one of fsyncs only.
    fn sync_fault(&self, node: &Node) -> Result<(), Errno> {
        match self.injected(node) {
            Some((e, true)) => Err(Errno::from_i32(e)),
            Some((libc::EIO, false)) => Err(Errno::EIO),
            _ => Ok(()),
        }
    }

    fn injected(&self, node: &Node) -> Option<(i32, bool)> {
        let d = node.domain.as_ref()?;
        lock(&self.shared.faults).get(d).copied()
    }

    fn attr(&self, ino: u64, key: Key, st: &FileStat) -> FileAttr {
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
    fn lookup_in(&self, parent: &Node, name: &OsStr) -> io::Result<(u64, Arc<Node>, FileStat)> {
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

    fn entry(&self, parent: &Node, name: &OsStr, reply: ReplyEntry) {
        match self.lookup_in(parent, name) {
            Ok((ino, n, st)) => reply.entry(&TTL, &self.attr(ino, n.key, &st), Generation(0)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn owner(&self, dir: &Node, name: &OsStr, req: &Request) -> io::Result<()> {
        fchownat(
            dir.fd.as_fd(),
            name,
            Some(Uid::from_raw(req.uid())),
            Some(Gid::from_raw(req.gid())),
            AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .map_err(io_err)
    }

    fn register(&self, file: File, node: Arc<Node>, flags: i32) -> u64 {
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
    fn set_len(&self, node: &Node, file: Option<&File>, size: u64) -> io::Result<()> {
        self.shared
            .journal
            .modify(node.key, &node.fd, Change::SetLen(size), || match file {
                Some(f) => f.set_len(size),
                None => reopen(&node.fd, libc::O_WRONLY)?.set_len(size),
            })
    }

    fn read_dir(&self, node: &Node) -> io::Result<Listing> {
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

macro_rules! on {
    ($self:ident, $reply:ident) => {
        match $self.power() {
            Ok(g) => g,
            Err(e) => return $reply.error(e),
        }
    };
}

macro_rules! get {
    ($e:expr, $reply:ident) => {
        match $e {
            Ok(v) => v,
            Err(e) => return $reply.error(e),
        }
    };
}

impl Filesystem for PowerCut {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        // Fewer, larger writes; the kernel lowers it if it must.
        let _ = config.set_max_write(1 << 20);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let _p = on!(self, reply);
        let parent = get!(self.node(parent), reply);
        self.entry(&parent, name, reply)
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        if ino.0 == 1 {
            return;
        }
        let mut nodes = lock(&self.nodes);
        let Some(n) = nodes.by_ino.get(&ino.0).cloned() else {
            return;
        };
        if n.lookups.fetch_sub(nlookup, Ordering::Relaxed) <= nlookup {
            nodes.by_ino.remove(&ino.0);
            if nodes.by_key.get(&n.key) == Some(&ino.0) {
                nodes.by_key.remove(&n.key);
            }
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let _p = on!(self, reply);
        let n = get!(self.node(ino), reply);
        match fstat(n.fd.as_fd()) {
            Ok(st) => reply.attr(&TTL, &self.attr(ino.0, n.key, &st)),
            Err(e) => reply.error(nix_errno(e)),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let _p = on!(self, reply);
        let n = get!(self.node(ino), reply);
        let r = (|| -> io::Result<()> {
            if let Some(m) = mode {
                nix::sys::stat::fchmodat(
                    nix::fcntl::AT_FDCWD,
                    proc_path(&n.fd).as_str(),
                    Mode::from_bits_truncate(m & 0o7777),
                    nix::sys::stat::FchmodatFlags::FollowSymlink,
                )
                .map_err(io_err)?;
            }
            if uid.is_some() || gid.is_some() {
                fchownat(
                    n.fd.as_fd(),
                    "",
                    uid.map(Uid::from_raw),
                    gid.map(Gid::from_raw),
                    AtFlags::AT_EMPTY_PATH | AtFlags::AT_SYMLINK_NOFOLLOW,
                )
                .map_err(io_err)?;
            }
            if let Some(s) = size {
                if let Err(e) = self.fault(&n) {
                    return Err(io::Error::from_raw_os_error(e.code()));
                }
                let f = fh.and_then(|h| self.file(h).ok());
                self.set_len(&n, f.as_ref().map(|f| &f.file), s)?;
            }
            if atime.is_some() || mtime.is_some() {
                nix::sys::stat::utimensat(
                    nix::fcntl::AT_FDCWD,
                    proc_path(&n.fd).as_str(),
                    &timespec(atime),
                    &timespec(mtime),
                    nix::sys::stat::UtimensatFlags::FollowSymlink,
                )
                .map_err(io_err)?;
            }
            Ok(())
        })();
        if let Err(e) = r {
            return reply.error(errno(&e));
        }
        match fstat(n.fd.as_fd()) {
            Ok(st) => reply.attr(&TTL, &self.attr(ino.0, n.key, &st)),
            Err(e) => reply.error(nix_errno(e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let _p = on!(self, reply);
        let n = get!(self.node(ino), reply);
        match nix::fcntl::readlinkat(n.fd.as_fd(), "") {
            Ok(t) => reply.data(t.as_bytes()),
            Err(e) => reply.error(nix_errno(e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let _p = on!(self, reply);
        let p = get!(self.node(parent), reply);
        get!(self.fault(&p), reply);
        let r = self.shared.journal.add_name(p.key, &p.fd, name, false, || {
            mknodat(
                p.fd.as_fd(),
                name,
                SFlag::from_bits_truncate(mode & libc::S_IFMT),
                Mode::from_bits_truncate(mode & 0o7777),
                rdev as libc::dev_t,
            )
            .map_err(io_err)?;
            self.owner(&p, name, req)
        });
        match r {
            Ok(()) => self.entry(&p, name, reply),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let _p = on!(self, reply);
        let p = get!(self.node(parent), reply);
        get!(self.fault(&p), reply);
        let r = self.shared.journal.add_name(p.key, &p.fd, name, true, || {
            mkdirat(p.fd.as_fd(), name, Mode::from_bits_truncate(mode & 0o7777)).map_err(io_err)?;
            self.owner(&p, name, req)
        });
        match r {
            Ok(()) => self.entry(&p, name, reply),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _p = on!(self, reply);
        let p = get!(self.node(parent), reply);
        match self.shared.journal.unlink(p.key, &p.fd, name) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _p = on!(self, reply);
        let p = get!(self.node(parent), reply);
        match self.shared.journal.rmdir(p.key, &p.fd, name) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let _p = on!(self, reply);
        let p = get!(self.node(parent), reply);
        get!(self.fault(&p), reply);
        let r = self
            .shared
            .journal
            .add_name(p.key, &p.fd, link_name, false, || {
                symlinkat(target, p.fd.as_fd(), link_name).map_err(io_err)?;
                self.owner(&p, link_name, req)
            });
        match r {
            Ok(()) => self.entry(&p, link_name, reply),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: FuseRenameFlags,
        reply: ReplyEmpty,
    ) {
        let _p = on!(self, reply);
        let from = get!(self.node(parent), reply);
        let to = get!(self.node(newparent), reply);
        get!(self.fault(&to), reply);
        let flags = RenameFlags::from_bits_truncate(flags.bits());
        match self
            .shared
            .journal
            .rename(from.key, &from.fd, name, to.key, &to.fd, newname, flags)
        {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let _p = on!(self, reply);
        let n = get!(self.node(ino), reply);
        let p = get!(self.node(newparent), reply);
        get!(self.fault(&p), reply);
        let r = self
            .shared
            .journal
            .add_name(p.key, &p.fd, newname, false, || {
                linkat(
                    n.fd.as_fd(),
                    "",
                    p.fd.as_fd(),
                    newname,
                    AtFlags::AT_EMPTY_PATH,
                )
                .map_err(io_err)
            });
        match r {
            Ok(()) => self.entry(&p, newname, reply),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let _p = on!(self, reply);
        let n = get!(self.node(ino), reply);
        let r = (|| {
            let f = reopen(&n.fd, open_flags(flags.0))?;
            if flags.0 & libc::O_TRUNC != 0 && flags.0 & libc::O_ACCMODE != libc::O_RDONLY {
                self.set_len(&n, Some(&f), 0)?;
            }
            Ok::<_, io::Error>(f)
        })();
        match r {
            Ok(f) => reply.opened(
                FileHandle(self.register(f, n, flags.0)),
                FopenFlags::empty(),
            ),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let _p = on!(self, reply);
        let p = get!(self.node(parent), reply);
        get!(self.fault(&p), reply);
        let acc = OFlag::from_bits_truncate(open_flags(flags) | libc::O_CLOEXEC);
        let made = self.shared.journal.add_name(p.key, &p.fd, name, false, || {
            let fd = openat(
                p.fd.as_fd(),
                name,
                acc | OFlag::O_CREAT | OFlag::O_EXCL,
                Mode::from_bits_truncate(mode & 0o7777),
            )
            .map_err(io_err)?;
            self.owner(&p, name, req)?;
            Ok(fd)
        });
        let fd: OwnedFd = match made {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) && flags & libc::O_EXCL == 0 => {
                get!(
                    openat(p.fd.as_fd(), name, acc, Mode::empty()).map_err(nix_errno),
                    reply
                )
            }
            Err(e) => return reply.error(errno(&e)),
        };
        let (ino, n, st) = match self.lookup_in(&p, name) {
            Ok(v) => v,
            Err(e) => return reply.error(errno(&e)),
        };
        let file = File::from(fd);
        if flags & libc::O_TRUNC != 0
            && let Err(e) = self.set_len(&n, Some(&file), 0)
        {
            return reply.error(errno(&e));
        }
        let attr = self.attr(ino, n.key, &st);
        let fh = self.register(file, n, flags);
        reply.created(
            &TTL,
            &attr,
            Generation(0),
            FileHandle(fh),
            FopenFlags::empty(),
        )
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let _p = on!(self, reply);
        let f = get!(self.file(fh), reply);
        let mut buf = vec![0u8; size as usize];
        let mut got = 0;
        while got < buf.len() {
            match f.file.read_at(&mut buf[got..], offset + got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return reply.error(errno(&e)),
            }
        }
        reply.data(&buf[..got])
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let _p = on!(self, reply);
        let f = get!(self.file(fh), reply);
        get!(self.fault(&f.node), reply);
        let change = Change::Write {
            off: offset,
            len: data.len() as u64,
        };
        let r = self
            .shared
            .journal
            .modify(f.node.key, &f.node.fd, change, || {
                f.file.write_all_at(data, offset)
            });
        match r {
            Ok(()) => {
                if f.sync_writes {
                    self.shared.journal.sync_file(f.node.key);
                }
                reply.written(data.len() as u32)
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok()
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        lock(&self.files).remove(&fh.0);
        reply.ok()
    }

    /// fsync and fdatasync: the file's data and size are durable.
    fn fsync(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _ds: bool, reply: ReplyEmpty) {
        let _p = on!(self, reply);
        let n = get!(self.node(ino), reply);
        get!(self.sync_fault(&n), reply);
        self.shared.journal.sync_file(n.key);
        reply.ok()
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let _p = on!(self, reply);
        let n = get!(self.node(ino), reply);
        match self.read_dir(&n) {
            Ok(v) => {
                let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
                lock(&self.dirs).insert(fh, Arc::new(v));
                reply.opened(FileHandle(fh), FopenFlags::empty())
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let _p = on!(self, reply);
        let Some(entries) = lock(&self.dirs).get(&fh.0).cloned() else {
            return reply.error(Errno::EBADF);
        };
        for (i, (name, ino, k)) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(*ino), i as u64 + 1, *k, name) {
                break;
            }
        }
        reply.ok()
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        lock(&self.dirs).remove(&fh.0);
        reply.ok()
    }

    /// fsync of a directory: its entries (and every namespace change
    /// before the last one in it) are durable.
    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _ds: bool,
        reply: ReplyEmpty,
    ) {
        let _p = on!(self, reply);
        let n = get!(self.node(ino), reply);
        get!(self.sync_fault(&n), reply);
        self.shared.journal.sync_dir(n.key);
        reply.ok()
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let _p = on!(self, reply);
        let root = get!(self.node(INodeNo(1)), reply);
        match nix::sys::statvfs::fstatvfs(root.fd.as_fd()) {
            Ok(s) => reply.statfs(
                s.blocks(),
                s.blocks_free(),
                s.blocks_available(),
                s.files(),
                s.files_free(),
                s.block_size() as u32,
                s.name_max() as u32,
                s.fragment_size() as u32,
            ),
            Err(e) => reply.error(nix_errno(e)),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let _p = on!(self, reply);
        let f = get!(self.file(fh), reply);
        get!(self.fault(&f.node), reply);
        let change = Change::Write {
            off: offset,
            len: length,
        };
        let r = self
            .shared
            .journal
            .modify(f.node.key, &f.node.fd, change, || {
                nix::fcntl::fallocate(
                    f.file.as_fd(),
                    nix::fcntl::FallocateFlags::from_bits_truncate(mode),
                    offset as i64,
                    length as i64,
                )
                .map_err(io_err)
            });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }
}

fn nix_errno(e: nix::Error) -> Errno {
    Errno::from_i32(e as i32)
}
