//! The fuser adapter: a translation table. Each callback turns fuser's
//! arguments into one call of [`Core`] and its result into one reply
//! through [`answer`]; no filesystem rule lives here.
//!
//! Every request is counted by kind as it arrives (for `leasefs stats`)
//! and runs inside `catch_unwind` ([`Adapter::contain`]): a panic while
//! serving one request costs that request `EIO` (fuser answers `EIO` for a
//! reply dropped unsent, and the unwinding drops it) and the request
//! thread serves on; without it, a panic on fuser's first request thread
//! ended the session, and the mount. The panic itself is logged by the
//! daemon's panic hook (`crate::fault`). Work a callback hands to other
//! threads (the blocking pool, stream workers) is contained there.

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
use super::core::{Caller, Core, Opened, Reply};
use super::namespace::{Node, Statfs};
use crate::error::FsResult;
use crate::meta::{AttrChange, DirEntry, Kind};
use crate::metrics::Op;
use crate::sync::Arc;

/// Attribute and entry cache lifetime for files nobody is writing. Files
/// under construction get 0 so `stat` follows the visible length.
const TTL: Duration = Duration::from_secs(1);
/// What a create reply's attributes stay valid for: the kernel rounds any
/// non-zero time up to a clock tick, so they stay valid for one to two
/// ticks (at most 8 ms at HZ 250); zero would mean not at all.
const CREATED_TTL: Duration = Duration::from_nanos(1);

pub struct Adapter {
    pub core: Arc<Core>,
}

impl Adapter {
    /// One request as it arrives: counted by kind (one relaxed atomic
    /// add), its panic, if any, logged and ended here.
    fn contain(&self, op: Op, f: impl FnOnce()) {
        self.core.ctx.metrics.op(op);
        if let Err(why) = crate::fault::catch(f) {
            tracing::error!(
                op = op.name(),
                "request failed with EIO: it panicked ({why})"
            );
        }
    }

    /// A request whose work may wait on the metadata store: inline when
    /// the store is local (SQLite, microseconds), on the blocking pool
    /// when it is a network round trip away (etcd), so that a slow or
    /// unreachable etcd never holds up a request thread. Requests whose
    /// core call already replies from elsewhere (read, write, flush,
    /// release, fsync, fallocate) go through [`Adapter::contain`] alone.
    fn request(&self, op: Op, f: impl FnOnce(&Arc<Core>) + Send + 'static) {
        self.contain(op, || {
            if self.core.cluster.is_some() {
                let core = self.core.clone();
                self.core.ctx.rt.spawn_blocking(move || f(&core));
            } else {
                f(&self.core)
            }
        })
    }

    fn mknode(
        &self,
        op: Op,
        parent: INodeNo,
        name: &OsStr,
        node: Node,
        req: &Request,
        reply: ReplyEntry,
    ) {
        let (name, who) = (bytes(name), caller(req));
        self.request(op, move |c| {
            answer(reply, c.mknode(parent.0, &name, node, who))
        })
    }
}

/// What a successful result becomes in one of fuser's reply types.
trait Answer: Send + 'static {
    type Value;
    fn ok(self, v: Self::Value);
    fn error(self, e: Errno);
}

/// The one place a core result becomes a reply: a value as its reply
/// type wants it, an error as its errno (see `FsError::errno`).
fn answer<A: Answer>(reply: A, r: FsResult<A::Value>) {
    match r {
        Ok(v) => reply.ok(v),
        Err(e) => {
            tracing::debug!("request failed: {e}");
            reply.error(Errno::from_i32(e.errno()))
        }
    }
}

/// A completion for core calls that reply from another thread.
fn later<A: Answer>(reply: A) -> Reply<A::Value> {
    Box::new(move |r| answer(reply, r))
}

impl Answer for ReplyEmpty {
    type Value = ();
    fn ok(self, (): ()) {
        ReplyEmpty::ok(self)
    }
    fn error(self, e: Errno) {
        ReplyEmpty::error(self, e)
    }
}

impl Answer for ReplyAttr {
    type Value = Attr;
    fn ok(self, a: Attr) {
        self.attr(&ttl(&a), &fattr(&a))
    }
    fn error(self, e: Errno) {
        ReplyAttr::error(self, e)
    }
}

impl Answer for ReplyEntry {
    type Value = Attr;
    fn ok(self, a: Attr) {
        self.entry(&ttl(&a), &fattr(&a), Generation(0))
    }
    fn error(self, e: Errno) {
        ReplyEntry::error(self, e)
    }
}

impl Answer for ReplyCreate {
    type Value = (Attr, Opened);
    fn ok(self, (a, o): (Attr, Opened)) {
        // The new file is being written, so its attributes are not cached
        // (as `ttl` has it) but for the shortest time the kernel keeps: a
        // tick or two. Open's own permission check, right after this reply
        // in the same open(2), would otherwise cost a GETATTR per created
        // file (default_permissions refreshes expired attributes first);
        // docs/SEMANTICS.md "Visible length" states the exception.
        self.created(
            &CREATED_TTL,
            &fattr(&a),
            Generation(0),
            FileHandle(o.fh),
            open_flags(&o),
        )
    }
    fn error(self, e: Errno) {
        ReplyCreate::error(self, e)
    }
}

impl Answer for ReplyOpen {
    type Value = Opened;
    fn ok(self, o: Opened) {
        self.opened(FileHandle(o.fh), open_flags(&o))
    }
    fn error(self, e: Errno) {
        ReplyOpen::error(self, e)
    }
}

impl Answer for ReplyData {
    type Value = Vec<u8>;
    fn ok(self, d: Vec<u8>) {
        self.data(&d);
        crate::pipeline::reader::recycle(d)
    }
    fn error(self, e: Errno) {
        ReplyData::error(self, e)
    }
}

impl Answer for ReplyWrite {
    type Value = u32;
    fn ok(self, n: u32) {
        self.written(n)
    }
    fn error(self, e: Errno) {
        ReplyWrite::error(self, e)
    }
}

impl Answer for ReplyIoctl {
    type Value = Vec<u8>;
    fn ok(self, d: Vec<u8>) {
        self.ioctl(0, &d)
    }
    fn error(self, e: Errno) {
        ReplyIoctl::error(self, e)
    }
}

impl Answer for ReplyStatfs {
    type Value = Statfs;
    fn ok(self, s: Statfs) {
        self.statfs(
            s.blocks,
            s.free_blocks,
            s.free_blocks,
            s.files,
            u64::from(u32::MAX),
            Statfs::BLOCK_SIZE,
            255,
            Statfs::BLOCK_SIZE,
        )
    }
    fn error(self, e: Errno) {
        ReplyStatfs::error(self, e)
    }
}

/// An xattr value or name list, and the buffer size the caller offered
/// (0: it asks for the size only).
struct XattrReply(ReplyXattr, u32);

impl Answer for XattrReply {
    type Value = Vec<u8>;
    fn ok(self, v: Vec<u8>) {
        let XattrReply(reply, size) = self;
        if size == 0 {
            reply.size(v.len() as u32)
        } else if v.len() > size as usize {
            reply.error(Errno::ERANGE)
        } else {
            reply.data(&v)
        }
    }
    fn error(self, e: Errno) {
        self.0.error(e)
    }
}

fn bytes(name: &OsStr) -> Vec<u8> {
    name.as_bytes().to_vec()
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

fn open_flags(o: &Opened) -> FopenFlags {
    let mut f = FopenFlags::empty();
    if o.direct_io {
        f |= FopenFlags::FOPEN_DIRECT_IO;
    }
    if o.keep_cache {
        f |= FopenFlags::FOPEN_KEEP_CACHE;
    }
    f
}

/// FUSE's list of xattr names: each one NUL-terminated.
fn name_list(names: Vec<Vec<u8>>) -> Vec<u8> {
    let mut out = Vec::new();
    for n in names {
        out.extend_from_slice(&n);
        out.push(0);
    }
    out
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

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let name = bytes(name);
        self.request(Op::Lookup, move |c| {
            answer(reply, c.lookup(parent.0, &name))
        })
    }

    /// The kernel evicted the inode, and its cached pages with it.
    fn forget(&self, _req: &Request, ino: INodeNo, _nlookup: u64) {
        self.contain(Op::Forget, || self.core.forget_pages(ino.0))
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.request(Op::Getattr, move |c| answer(reply, c.getattr(ino.0)))
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
        let who = caller(req);
        let ch = AttrChange {
            mode,
            uid,
            gid,
            atime: atime.map(time_or_now),
            mtime: mtime.map(time_or_now),
            ctime: ctime.map(ns),
        };
        let fh = fh.map(|f| f.0);
        self.request(Op::Setattr, move |c| {
            c.setattr(ino.0, size, fh, ch, who, later(reply))
        })
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        self.request(Op::Readlink, move |c| answer(reply, c.readlink(ino.0)))
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
            return self.contain(Op::Mknod, || reply.error(Errno::EINVAL));
        };
        let node = Node {
            kind,
            mode,
            rdev,
            target: None,
            umask,
        };
        self.mknode(Op::Mknod, parent, name, node, req, reply)
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
        self.mknode(Op::Mkdir, parent, name, node, req, reply)
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let (name, who) = (bytes(name), caller(req));
        self.request(Op::Unlink, move |c| {
            answer(reply, c.unlink(parent.0, &name, who))
        })
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let (name, who) = (bytes(name), caller(req));
        self.request(Op::Rmdir, move |c| {
            answer(reply, c.rmdir(parent.0, &name, who))
        })
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
        self.mknode(Op::Symlink, parent, link_name, node, req, reply)
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
        let (name, newname, who) = (bytes(name), bytes(newname), caller(req));
        self.request(Op::Rename, move |c| {
            let r = c.rename(parent.0, &name, newparent.0, &newname, flags.bits(), who);
            answer(reply, r)
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
        let (newname, who) = (bytes(newname), caller(req));
        self.request(Op::Link, move |c| {
            answer(reply, c.link(ino.0, newparent.0, &newname, who))
        })
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let who = caller(req);
        self.request(Op::Open, move |c| c.open(ino.0, flags.0, who, later(reply)))
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
        mut reply: ReplyData,
    ) {
        self.contain(Op::Read, || {
            // Over a ring, bytes in memory are read straight into the
            // buffer the reply leaves from (one copy of 1 MiB less).
            let tried = match reply.buffer(size as usize) {
                Some(buf) => match self.core.read_in_memory(fh.0, offset, buf) {
                    Some(n) => return reply.data_in_buffer(n),
                    None => true,
                },
                None => false,
            };
            self.core.read_any(fh.0, offset, size, !tried, later(reply))
        })
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
        self.contain(Op::Write, || {
            self.core
                .write(fh.0, offset, data, (caller(req), kill), later(reply))
        })
    }

    fn flush(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        self.contain(Op::Flush, || {
            self.core.flush(fh.0, caller(req), later(reply))
        })
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
        self.contain(Op::Release, || self.core.release(fh.0, later(reply)))
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.contain(Op::Fsync, || self.core.fsync(fh.0, later(reply)))
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        self.request(Op::Readdir, move |c| {
            let mut add = |e: &DirEntry| {
                let name = OsStr::from_bytes(&e.name);
                reply.add(INodeNo(e.ino), e.cookie, file_type(e.kind), name)
            };
            match c.readdir(ino.0, offset, &mut add) {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(Errno::from_i32(e.errno())),
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
        self.contain(Op::Fsyncdir, || self.core.fsync_dir(later(reply)))
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        self.request(Op::Statfs, move |c| answer(reply, c.statfs()))
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
        let (name, value, who) = (bytes(name), value.to_vec(), caller(req));
        self.request(Op::Setxattr, move |c| {
            answer(reply, c.setxattr(ino.0, &name, &value, flags, who))
        })
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let (name, who) = (bytes(name), caller(req));
        self.request(Op::Getxattr, move |c| {
            answer(XattrReply(reply, size), c.getxattr(ino.0, &name, who))
        })
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        self.request(Op::Listxattr, move |c| {
            answer(XattrReply(reply, size), c.listxattr(ino.0).map(name_list))
        })
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let (name, who) = (bytes(name), caller(req));
        self.request(Op::Removexattr, move |c| {
            answer(reply, c.removexattr(ino.0, &name, who))
        })
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        // default_permissions: the kernel has already checked.
        self.contain(Op::Access, || reply.ok())
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
        let (name, who) = (bytes(name), caller(req));
        let node = Node {
            kind: Kind::File,
            mode,
            rdev: 0,
            target: None,
            umask,
        };
        self.request(Op::Create, move |c| {
            c.create(parent.0, &name, node, flags, who, later(reply))
        })
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
        self.contain(Op::Fallocate, || {
            let who = caller(req);
            self.core
                .fallocate(fh.0, offset, length, mode, who, later(reply))
        })
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
        self.request(Op::Ioctl, move |c| answer(reply, c.ioctl(fh.0, cmd)))
    }
}
