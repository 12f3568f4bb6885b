//! Panic containment around the fuser adapter: every callback of
//! [`Adapter`] runs inside `catch_unwind`, so a panic while serving one
//! request costs that request `EIO` (fuser answers `EIO` for every reply
//! dropped unsent, and the unwinding drops it) and the request thread
//! serves on. Without it, a panic on fuser's first request thread ended the
//! session (and the mount), and on another one lost that thread for good.
//! The panic itself is logged by the daemon's panic hook (`crate::fault`).
//! Work a callback hands to other threads (the blocking pool, stream
//! workers) is contained there.

use std::ffi::OsStr;
use std::path::Path;
use std::time::SystemTime;

use fuser::{
    AccessFlags, BsdFileFlags, FileHandle, Filesystem, INodeNo, IoctlFlags, KernelConfig,
    LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request,
    TimeOrNow, WriteFlags,
};

use super::adapter::Adapter;

/// The adapter, with each callback's panics contained to its request.
pub struct Contained(pub Adapter);

/// Runs one callback; a panic in it is logged and ends there.
fn contain(op: &'static str, f: impl FnOnce()) {
    if let Err(why) = crate::fault::catch(f) {
        tracing::error!(op, "request failed with EIO: it panicked ({why})");
    }
}

impl Filesystem for Contained {
    fn init(&mut self, req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        self.0.init(req, config)
    }

    fn destroy(&mut self) {
        self.0.destroy()
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        contain("lookup", move || self.0.lookup(req, parent, name, reply))
    }

    fn forget(&self, req: &Request, ino: INodeNo, nlookup: u64) {
        contain("forget", move || self.0.forget(req, ino, nlookup))
    }

    fn getattr(&self, req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        contain("getattr", move || self.0.getattr(req, ino, fh, reply))
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
        crtime: Option<SystemTime>,
        chgtime: Option<SystemTime>,
        bkuptime: Option<SystemTime>,
        flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        contain("setattr", move || {
            self.0.setattr(
                req, ino, mode, uid, gid, size, atime, mtime, ctime, fh, crtime, chgtime, bkuptime,
                flags, reply,
            )
        })
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        contain("readlink", move || self.0.readlink(req, ino, reply))
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
        contain("mknod", move || {
            self.0.mknod(req, parent, name, mode, umask, rdev, reply)
        })
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
        contain("mkdir", move || {
            self.0.mkdir(req, parent, name, mode, umask, reply)
        })
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        contain("unlink", move || self.0.unlink(req, parent, name, reply))
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        contain("rmdir", move || self.0.rmdir(req, parent, name, reply))
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        contain("symlink", move || {
            self.0.symlink(req, parent, link_name, target, reply)
        })
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
        contain("rename", move || {
            self.0
                .rename(req, parent, name, newparent, newname, flags, reply)
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
        contain("link", move || {
            self.0.link(req, ino, newparent, newname, reply)
        })
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        contain("open", move || self.0.open(req, ino, flags, reply))
    }

    fn read(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        flags: OpenFlags,
        lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        contain("read", move || {
            self.0
                .read(req, ino, fh, offset, size, flags, lock_owner, reply)
        })
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        flags: OpenFlags,
        lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        contain("write", move || {
            self.0.write(
                req,
                ino,
                fh,
                offset,
                data,
                write_flags,
                flags,
                lock_owner,
                reply,
            )
        })
    }

    fn flush(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        contain("flush", move || {
            self.0.flush(req, ino, fh, lock_owner, reply)
        })
    }

    fn release(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        flags: OpenFlags,
        lock_owner: Option<LockOwner>,
        flush: bool,
        reply: ReplyEmpty,
    ) {
        contain("release", move || {
            self.0
                .release(req, ino, fh, flags, lock_owner, flush, reply)
        })
    }

    fn fsync(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        contain("fsync", move || self.0.fsync(req, ino, fh, datasync, reply))
    }

    fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectory,
    ) {
        contain("readdir", move || {
            self.0.readdir(req, ino, fh, offset, reply)
        })
    }

    fn fsyncdir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        contain("fsyncdir", move || {
            self.0.fsyncdir(req, ino, fh, datasync, reply)
        })
    }

    fn statfs(&self, req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        contain("statfs", move || self.0.statfs(req, ino, reply))
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        position: u32,
        reply: ReplyEmpty,
    ) {
        contain("setxattr", move || {
            self.0
                .setxattr(req, ino, name, value, flags, position, reply)
        })
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        contain("getxattr", move || {
            self.0.getxattr(req, ino, name, size, reply)
        })
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        contain("listxattr", move || self.0.listxattr(req, ino, size, reply))
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        contain("removexattr", move || {
            self.0.removexattr(req, ino, name, reply)
        })
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        contain("access", move || self.0.access(req, ino, mask, reply))
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
        contain("create", move || {
            self.0.create(req, parent, name, mode, umask, flags, reply)
        })
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        contain("fallocate", move || {
            self.0.fallocate(req, ino, fh, offset, length, mode, reply)
        })
    }

    fn ioctl(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        flags: IoctlFlags,
        cmd: u32,
        in_data: &[u8],
        out_size: u32,
        reply: ReplyIoctl,
    ) {
        contain("ioctl", move || {
            self.0
                .ioctl(req, ino, fh, flags, cmd, in_data, out_size, reply)
        })
    }
}
