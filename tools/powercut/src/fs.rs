//! The FUSE side: each request of the passthrough over `BACKING/root`
//! (inodes and helpers in `nodes`), its changes going through the
//! journal so that a cut can drop those not yet durable.
//!
//! POSIX record locks and `flock` are left to the kernel (no lock
//! capability is negotiated, so they work locally, as SQLite needs), and
//! so are FIFOs and sockets once created. Extended attributes are not
//! supported. Every request holds the power lock for reading; a cut takes
//! it for writing, so no change lands after it, and from then on every
//! request fails with `EIO`.

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::SystemTime;

use fuser::{
    Errno, FileHandle, Filesystem, FopenFlags, Generation, INodeNo, KernelConfig, LockOwner,
    OpenFlags, RenameFlags as FuseRenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};
use nix::fcntl::{AtFlags, OFlag, RenameFlags, openat};
use nix::sys::stat::{Mode, SFlag, fstat, mkdirat, mknodat};
use nix::unistd::{Gid, Uid, fchownat, linkat, symlinkat};

use crate::journal::{Change, io_err, reopen};
use crate::nodes::*;

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
                let n = data.len() as u32;
                match self.slowed(&f.node) {
                    // A slow disk: the write is made, its answer comes late.
                    Some(d) => self.shared.late.after(d, move || reply.written(n)),
                    None => reply.written(n),
                }
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
