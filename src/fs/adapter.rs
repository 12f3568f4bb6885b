//! The fuser adapter: each callback becomes one call of [`Core`] and its
//! result one reply. No filesystem rule lives here.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    AccessFlags, BsdFileFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags,
    Generation, INodeNo, InitFlags, IoctlFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags,
    ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyIoctl,
    ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use super::attr::Attr;
use super::core::{Caller, Core};
use super::namespace::Node;
use crate::error::FsError;
use crate::meta::{AttrChange, DirEntry, Kind};
use crate::sync::Arc;

/// Attribute and entry cache lifetime for files nobody is writing. Files
/// under construction get 0 so `stat` follows the visible length.
const TTL: Duration = Duration::from_secs(1);

pub struct Adapter {
    pub core: Arc<Core>,
}

impl Adapter {
    /// Runs one request's work where it may wait: inline when the metadata
    /// is local (SQLite, microseconds), on the blocking pool when it is a
    /// network round trip away (etcd), so that a slow or unreachable etcd
    /// never holds up a request thread.
    fn run(&self, f: impl FnOnce(&Arc<Core>) + Send + 'static) {
        if self.core.cluster.is_some() {
            let core = self.core.clone();
            self.core.ctx.rt.spawn_blocking(move || f(&core));
        } else {
            f(&self.core)
        }
    }

    fn mknode(&self, parent: INodeNo, name: &OsStr, node: Node, who: Caller, reply: ReplyEntry) {
        let name = name.as_bytes().to_vec();
        self.run(move |c| entry(reply, c.mknode(parent.0, &name, node, who)))
    }
}

fn errno(e: &FsError) -> Errno {
    Errno::from_i32(e.errno())
}

fn time(ns: i64) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
    }
}

fn ns(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_nanos() as i64,
        Err(e) => -(e.duration().as_nanos() as i64),
    }
}

fn time_or_now(t: TimeOrNow) -> i64 {
    match t {
        TimeOrNow::SpecificTime(t) => ns(t),
        TimeOrNow::Now => crate::meta::now_ns(),
    }
}

fn file_type(k: Kind) -> FileType {
    match k {
        Kind::File => FileType::RegularFile,
        Kind::Dir => FileType::Directory,
        Kind::Symlink => FileType::Symlink,
        Kind::Fifo => FileType::NamedPipe,
        Kind::Socket => FileType::Socket,
        Kind::CharDev => FileType::CharDevice,
        Kind::BlockDev => FileType::BlockDevice,
    }
}

fn fattr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        // Whole 512-byte units, so tools never mistake a file for sparse.
        blocks: a.size.div_ceil(512),
        atime: time(a.atime),
        mtime: time(a.mtime),
        ctime: time(a.ctime),
        crtime: time(a.crtime),
        kind: file_type(a.kind),
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: 65536,
        flags: 0,
    }
}

fn ttl(a: &Attr) -> Duration {
    if a.under_construction {
        Duration::ZERO
    } else {
        TTL
    }
}

fn caller(req: &Request) -> Caller {
    Caller {
        pid: req.pid(),
        uid: req.uid(),
        gid: req.gid(),
    }
}

fn entry(reply: ReplyEntry, r: Result<Attr, FsError>) {
    match r {
        Ok(a) => reply.entry(&ttl(&a), &fattr(&a), Generation(0)),
        Err(e) => reply.error(errno(&e)),
    }
}

fn empty(reply: ReplyEmpty, r: Result<(), FsError>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(&e)),
    }
}

fn open_flags(o: &super::core::Opened) -> FopenFlags {
    let mut f = FopenFlags::empty();
    if o.direct_io {
        f |= FopenFlags::FOPEN_DIRECT_IO;
    }
    if o.keep_cache {
        f |= FopenFlags::FOPEN_KEEP_CACHE;
    }
    f
}

impl Filesystem for Adapter {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(1 << 20);
        let _ = config.set_max_readahead(1 << 20);
        // killpriv_v2 spares a GETXATTR before every write. No
        // FUSE_ATOMIC_O_TRUNC: with it the kernel drops the file's size and
        // pages once the open succeeds, before checking that truncating is
        // allowed (ETXTBSY), which crashed a program running from the file.
        // O_TRUNC then comes as a SETATTR through the new descriptor.
        // POSIX_ACL: the kernel checks permissions against ACLs and leaves
        // the mode/ACL rules to the core; DONT_MASK: the umask comes to
        // the core, which ignores it under a default ACL.
        let want = InitFlags::FUSE_HANDLE_KILLPRIV_V2
            | InitFlags::FUSE_POSIX_ACL
            | InitFlags::FUSE_DONT_MASK
            | InitFlags::FUSE_BIG_WRITES
            | InitFlags::FUSE_PARALLEL_DIROPS
            // mmap (running a program from the mount) of files opened
            // with direct I/O (those being written).
            | InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP;
        let _ = config.add_capabilities(want & config.capabilities());
        Ok(())
    }

    fn destroy(&mut self) {
        self.core.wait_closes(Duration::from_secs(30));
        self.core.persist_epochs();
        self.core.leases.shutdown();
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let name = name.as_bytes().to_vec();
        self.run(move |c| entry(reply, c.lookup(parent.0, &name)))
    }

    /// The kernel evicted the inode, and its cached pages with it.
    fn forget(&self, _req: &Request, ino: INodeNo, _nlookup: u64) {
        self.core.forget_pages(ino.0)
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.run(move |c| match c.getattr(ino.0) {
            Ok(a) => reply.attr(&ttl(&a), &fattr(&a)),
            Err(e) => reply.error(errno(&e)),
        })
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let c = caller(req);
        let ch = AttrChange {
            mode,
            uid,
            gid,
            atime: atime.map(time_or_now),
            mtime: mtime.map(time_or_now),
            ctime: ctime.map(ns),
        };
        let finish = move |core: &Core, reply: ReplyAttr| {
            let any = ch.mode.is_some()
                || ch.uid.is_some()
                || ch.gid.is_some()
                || ch.atime.is_some()
                || ch.mtime.is_some();
            let r = if any {
                core.set_attrs(ino.0, ch, c)
            } else {
                core.getattr(ino.0)
            };
            match r {
                Ok(a) => reply.attr(&ttl(&a), &fattr(&a)),
                Err(e) => reply.error(errno(&e)),
            }
        };
        self.run(move |core| match size {
            None => finish(core, reply),
            Some(size) => {
                let core2 = core.clone();
                core.set_size(
                    ino.0,
                    size,
                    fh.map(|f| f.0),
                    c,
                    Box::new(move |r| match r {
                        Ok(()) => finish(&core2, reply),
                        Err(e) => reply.error(errno(&e)),
                    }),
                );
            }
        })
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        self.run(move |c| match c.readlink(ino.0) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(errno(&e)),
        })
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let Some(kind) = Kind::from_mode(mode) else {
            return reply.error(Errno::EINVAL);
        };
        let node = Node {
            kind,
            mode,
            rdev,
            target: None,
            umask,
        };
        self.mknode(parent, name, node, caller(req), reply)
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let node = Node {
            kind: Kind::Dir,
            mode,
            rdev: 0,
            target: None,
            umask,
        };
        self.mknode(parent, name, node, caller(req), reply)
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let (name, who) = (name.as_bytes().to_vec(), caller(req));
        self.run(move |c| empty(reply, c.unlink(parent.0, &name, who)))
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let (name, who) = (name.as_bytes().to_vec(), caller(req));
        self.run(move |c| empty(reply, c.rmdir(parent.0, &name, who)))
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let node = Node {
            kind: Kind::Symlink,
            mode: 0o777,
            rdev: 0,
            target: Some(target.as_os_str().as_bytes().to_vec()),
            umask: 0,
        };
        self.mknode(parent, link_name, node, caller(req), reply)
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let (name, newname) = (name.as_bytes().to_vec(), newname.as_bytes().to_vec());
        let who = caller(req);
        self.run(move |c| {
            let r = c.rename(parent.0, &name, newparent.0, &newname, flags.bits(), who);
            empty(reply, r)
        })
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let (newname, who) = (newname.as_bytes().to_vec(), caller(req));
        self.run(move |c| entry(reply, c.link(ino.0, newparent.0, &newname, who)))
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let who = caller(req);
        self.run(move |c| {
            c.open(
                ino.0,
                flags.0,
                who,
                Box::new(move |r| match r {
                    Ok(o) => reply.opened(FileHandle(o.fh), open_flags(&o)),
                    Err(e) => reply.error(errno(&e)),
                }),
            )
        })
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
        self.core.read_any(
            fh.0,
            offset,
            size,
            Box::new(move |r| match r {
                Ok(d) => reply.data(&d),
                Err(e) => reply.error(errno(&e)),
            }),
        )
    }

    fn write(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let kill = write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID);
        self.core.write(
            fh.0,
            offset,
            data,
            (caller(req), kill),
            Box::new(move |r| match r {
                Ok(n) => reply.written(n),
                Err(e) => reply.error(errno(&e)),
            }),
        )
    }

    fn flush(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        self.core
            .flush(fh.0, caller(req), Box::new(move |r| empty(reply, r)))
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
        self.core.release(fh.0, Box::new(move |r| empty(reply, r)))
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.core.fsync(fh.0, Box::new(move |r| empty(reply, r)))
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        self.run(move |c| {
            let mut add = |e: &DirEntry| {
                let name = OsStr::from_bytes(&e.name);
                reply.add(INodeNo(e.ino), e.cookie, file_type(e.kind), name)
            };
            match c.readdir(ino.0, offset, &mut add) {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(errno(&e)),
            }
        })
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.core.fsync_dir(Box::new(move |r| empty(reply, r)))
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        self.run(move |c| match c.statfs() {
            Ok((total, free, files)) => reply.statfs(
                total,
                free,
                free,
                files,
                u64::from(u32::MAX),
                4096,
                255,
                4096,
            ),
            Err(e) => reply.error(errno(&e)),
        })
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let (name, value, who) = (name.as_bytes().to_vec(), value.to_vec(), caller(req));
        self.run(move |c| empty(reply, c.setxattr(ino.0, &name, &value, flags, who)))
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let name = name.as_bytes().to_vec();
        self.run(move |c| xattr_reply(reply, size, c.getxattr(ino.0, &name)))
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        self.run(move |c| {
            let r = c.listxattr(ino.0).map(|names| {
                let mut out = Vec::new();
                for n in names {
                    out.extend_from_slice(&n);
                    out.push(0);
                }
                out
            });
            xattr_reply(reply, size, r)
        })
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let (name, who) = (name.as_bytes().to_vec(), caller(req));
        self.run(move |c| empty(reply, c.removexattr(ino.0, &name, who)))
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        // default_permissions: the kernel has already checked.
        reply.ok()
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let c = caller(req);
        let name = name.as_bytes().to_vec();
        self.run(move |core| create(core, parent, &name, (mode, umask), flags, c, reply))
    }

    fn fallocate(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        self.core.fallocate(
            fh.0,
            offset,
            length,
            mode,
            caller(req),
            Box::new(move |r| empty(reply, r)),
        )
    }

    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: IoctlFlags,
        cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        self.run(move |c| match c.ioctl(fh.0, cmd) {
            Ok(d) => reply.ioctl(0, &d),
            Err(e) => reply.error(errno(&e)),
        })
    }
}

fn xattr_reply(reply: ReplyXattr, size: u32, r: Result<Vec<u8>, FsError>) {
    match r {
        Ok(v) if size == 0 => reply.size(v.len() as u32),
        Ok(v) if v.len() > size as usize => reply.error(Errno::ERANGE),
        Ok(v) => reply.data(&v),
        Err(e) => reply.error(errno(&e)),
    }
}

/// Creates (unless it exists) and opens a file.
fn create(
    core: &Arc<Core>,
    parent: INodeNo,
    name: &[u8],
    (mode, umask): (u32, u32),
    flags: i32,
    c: Caller,
    reply: ReplyCreate,
) {
    let attr = match core.lookup(parent.0, name) {
        Ok(_) if flags & libc::O_EXCL != 0 => return reply.error(Errno::EEXIST),
        Ok(a) => a,
        Err(FsError::NotFound) => match core.mknode(
            parent.0,
            name,
            Node {
                kind: Kind::File,
                mode,
                rdev: 0,
                target: None,
                umask,
            },
            c,
        ) {
            Ok(a) => a,
            // Another daemon sharing the namespace created the name since
            // the lookup: without O_EXCL, open(O_CREAT) opens it.
            Err(FsError::Exists) if flags & libc::O_EXCL == 0 => {
                match core.lookup(parent.0, name) {
                    Ok(a) => a,
                    Err(e) => return reply.error(errno(&e)),
                }
            }
            Err(e) => return reply.error(errno(&e)),
        },
        Err(e) => return reply.error(errno(&e)),
    };
    let core2 = core.clone();
    core.open(
        attr.ino,
        flags,
        c,
        Box::new(move |r| match r {
            Ok(o) => {
                let a = core2.getattr(attr.ino).unwrap_or(attr);
                reply.created(
                    &Duration::ZERO,
                    &fattr(&a),
                    Generation(0),
                    FileHandle(o.fh),
                    open_flags(&o),
                )
            }
            Err(e) => reply.error(errno(&e)),
        }),
    )
}
