//! Namespace operations of [`Core`]: thin rules over the metadata store
//! (ownership and permissions of new nodes, when an unlinked file really
//! goes, listings that stay consistent while a directory changes) and
//! `statfs`.

use super::attr::Attr;
use super::core::{Caller, Core, Opened, Reply};
use crate::error::{FsError, FsResult};
use crate::meta::{AttrChange, DirEntry, FIRST_COOKIE, Inode, Kind, NewNode};
use crate::storage::Capacity;
use crate::sync::Arc;

/// The size `df` shows for an object-store datanode without
/// `-o s3_capacity=` (1 PiB, the free space its heartbeat reports): large
/// enough never to be the bound, and round enough to read as "no limit".
pub const UNBOUNDED: u64 = crate::storage::s3::FREE_BYTES;

const NAME_MAX: usize = 255;

/// Entries read from the store per page of a listing. A FUSE reply (4 to
/// 128 KiB) holds from about a hundred to a few thousand; it is filled
/// from as many pages as it takes.
const LISTING_PAGE: usize = 512;

/// What `mknode` creates.
pub struct Node {
    pub kind: Kind,
    pub mode: u32,
    pub rdev: u32,
    /// A symlink's target.
    pub target: Option<Vec<u8>>,
    /// The creating process's umask; applied unless the directory has a
    /// default ACL.
    pub umask: u32,
}

/// What `statfs` reports.
#[derive(Debug, Clone, Copy)]
pub struct Statfs {
    pub blocks: u64,
    pub free_blocks: u64,
    pub files: u64,
}

impl Statfs {
    pub const BLOCK_SIZE: u32 = 4096;
}

fn check_name(name: &[u8]) -> FsResult<()> {
    if name.len() > NAME_MAX {
        return Err(FsError::NameTooLong);
    }
    Ok(())
}

impl Core {
    pub fn lookup(&self, parent: u64, name: &[u8]) -> FsResult<Attr> {
        crate::fault::panic_if("request", || name == crate::fault::TRIGGER.as_bytes());
        check_name(name)?;
        let i = self.meta().lookup(parent, name)?;
        self.getattr(i.ino)
    }

    /// Creates a node owned by the caller; in a setgid directory it takes
    /// the directory's group (and a new directory keeps the setgid bit).
    /// Its permissions come from the directory's default ACL, or else from
    /// the mode and umask (see `new_node_acls`).
    pub fn mknode(&self, parent: u64, name: &[u8], node: Node, caller: Caller) -> FsResult<Attr> {
        self.make_node(parent, name, node, caller)
            .map(|i| Attr::from_inode(&i))
    }

    fn make_node(&self, parent: u64, name: &[u8], node: Node, caller: Caller) -> FsResult<Inode> {
        let Node {
            kind,
            mode,
            rdev,
            target,
            umask,
        } = node;
        self.may_change(caller)?;
        check_name(name)?;
        let (dir, default) = self.meta().get_with_xattr(parent, super::acl::DEFAULT)?;
        let (mode, xattrs) = self.new_node_acls(default.as_deref(), kind, mode & 0o7777, umask)?;
        let mut mode = mode & 0o7777;
        let gid = if dir.mode & libc::S_ISGID != 0 {
            if kind == Kind::Dir {
                mode |= libc::S_ISGID;
            }
            dir.gid
        } else {
            caller.gid
        };
        self.meta().create(
            parent,
            name,
            NewNode {
                kind,
                mode,
                uid: caller.uid,
                gid,
                rdev,
                target: target.as_deref(),
                block_size: self.opts.block_size,
                xattrs,
            },
        )
    }

    /// open(O_CREAT): creates the file and opens it; the reply carries
    /// the attributes as of the open.
    ///
    /// The kernel sends CREATE only after its lookup found no such name,
    /// and counts a successful CREATE as a new file: it skips its own
    /// open-permission check (and the truncation of `O_TRUNC`). So a name
    /// that exists by now (made through another daemon since that lookup)
    /// is never opened here: without `O_EXCL` the answer is `ESTALE`
    /// ([`FsError::Appeared`]), on which the kernel walks the path once
    /// more, finds the file and opens it as any open, checking mode,
    /// owner, groups and ACLs itself; with `O_EXCL`, `EEXIST`.
    pub fn create(
        self: &Arc<Self>,
        parent: u64,
        name: &[u8],
        node: Node,
        flags: i32,
        caller: Caller,
        reply: Reply<(Attr, Opened)>,
    ) {
        let excl = flags & libc::O_EXCL != 0;
        let made = match self.make_node(parent, name, node, caller) {
            Ok(i) => i,
            Err(FsError::Exists) if !excl => return reply(Err(FsError::Appeared)),
            Err(e) => return reply(Err(e)),
        };
        let attr = Attr::from_inode(&made);
        let me = self.clone();
        self.open_as(
            attr.ino,
            Some(made),
            flags,
            caller,
            Box::new(move |r| {
                reply(r.map(|o| {
                    let a = Attr {
                        under_construction: me.stream_of(attr.ino).is_some(),
                        ..attr
                    };
                    (a, o)
                }))
            }),
        )
    }

    /// SETATTR: a size change first (it may wait for the lease), then the
    /// other attributes; the reply carries the attributes after both.
    pub fn setattr(
        self: &Arc<Self>,
        ino: u64,
        size: Option<u64>,
        fh: Option<u64>,
        ch: AttrChange,
        caller: Caller,
        reply: Reply<Attr>,
    ) {
        let me = self.clone();
        let rest = move |r: FsResult<()>| {
            // A ctime alone is no change of its own (it comes with others).
            let any = ch.mode.is_some()
                || ch.uid.is_some()
                || ch.gid.is_some()
                || ch.atime.is_some()
                || ch.mtime.is_some();
            reply(r.and_then(|()| {
                if any {
                    me.set_attrs(ino, ch, caller)
                } else {
                    me.getattr(ino)
                }
            }))
        };
        match size {
            None => rest(Ok(())),
            Some(size) => self.set_size(ino, size, fh, caller, Box::new(rest)),
        }
    }

    pub fn link(&self, ino: u64, parent: u64, name: &[u8], caller: Caller) -> FsResult<Attr> {
        self.may_change(caller)?;
        check_name(name)?;
        let i = self.meta().link(ino, parent, name)?;
        self.getattr(i.ino)
    }

    /// Removes a name; the file itself goes when its last name and last
    /// open handle are both gone.
    pub fn unlink(&self, parent: u64, name: &[u8], caller: Caller) -> FsResult<()> {
        self.may_change(caller)?;
        let i = self.meta().unlink(parent, name)?;
        self.forget_if_unlinked(&i);
        Ok(())
    }

    fn forget_if_unlinked(&self, i: &Inode) {
        if i.nlink == 0 && !self.handles.unlinked_while_open(i.ino) {
            self.delete_inode(i.ino);
        }
    }

    pub fn rmdir(&self, parent: u64, name: &[u8], caller: Caller) -> FsResult<()> {
        self.may_change(caller)?;
        self.meta().rmdir(parent, name).map(|_| ())
    }

    pub fn rename(
        &self,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        flags: u32,
        caller: Caller,
    ) -> FsResult<()> {
        self.may_change(caller)?;
        check_name(newname)?;
        let noreplace = flags & libc::RENAME_NOREPLACE != 0;
        let exchange = flags & libc::RENAME_EXCHANGE != 0;
        if flags & !(libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE) != 0 {
            return Err(FsError::Invalid("unsupported rename flags".into()));
        }
        if let Some(i) = self
            .meta()
            .rename(parent, name, newparent, newname, noreplace, exchange)?
        {
            self.forget_if_unlinked(&i);
        }
        Ok(())
    }

    pub fn readlink(&self, ino: u64) -> FsResult<Vec<u8>> {
        self.meta().readlink(ino)
    }

    /// Lists directory `ino` from FUSE offset `offset` on, handing each
    /// entry to `add` until it says the reply is full (and the entry did
    /// not fit). An entry's offset is its cookie (`.` and `..` are 1 and
    /// 2), so offsets stay valid while entries come and go: each entry
    /// present for the whole listing is returned exactly once, and a page
    /// costs the same in a directory of any size.
    pub fn readdir(
        &self,
        ino: u64,
        offset: u64,
        add: &mut dyn FnMut(&DirEntry) -> bool,
    ) -> FsResult<()> {
        let dot = |name: &[u8], ino: u64, cookie: u64| DirEntry {
            name: name.to_vec(),
            ino,
            kind: Kind::Dir,
            cookie,
        };
        if offset < 1 && add(&dot(b".", ino, 1)) {
            return Ok(());
        }
        if offset < 2 && add(&dot(b"..", self.meta().parent_of(ino)?, 2)) {
            return Ok(());
        }
        let mut after = offset.max(FIRST_COOKIE - 1);
        loop {
            let page = self.meta().readdir(ino, after, LISTING_PAGE)?;
            for e in &page {
                if add(e) {
                    return Ok(());
                }
                after = e.cookie;
            }
            if page.len() < LISTING_PAGE {
                return Ok(());
            }
        }
    }

    /// chmod/chown/utimens. Ownership changes by a non-root caller clear
    /// setuid/setgid, as on local filesystems.
    pub fn set_attrs(&self, ino: u64, mut ch: AttrChange, caller: Caller) -> FsResult<Attr> {
        self.may_change(caller)?;
        if ch.uid.is_some() || ch.gid.is_some() {
            let cur = self.meta().get(ino)?;
            let changes_owner =
                ch.uid.is_some_and(|u| u != cur.uid) || ch.gid.is_some_and(|g| g != cur.gid);
            if (changes_owner || caller.uid != 0) && cur.kind != Kind::Dir && ch.mode.is_none() {
                let mut m = cur.mode;
                if caller.uid != 0 || changes_owner {
                    m &= !libc::S_ISUID;
                    if m & 0o010 != 0 {
                        m &= !libc::S_ISGID;
                    }
                }
                if m != cur.mode {
                    ch.mode = Some(m);
                }
            }
        }
        let i = match (ch.mtime, self.stream_of(ino)) {
            (Some(m), Some(stream)) => stream.set_mtime(m, || self.commit_attrs(ino, &ch))?,
            _ => self.commit_attrs(ino, &ch)?,
        };
        let mut a = self.getattr(i.ino)?;
        a.ctime = i.ctime;
        Ok(a)
    }

    /// Sizes in 4 KiB blocks, from the fullest live datanode in service
    /// that counts toward the replication factor (every block needs room
    /// on several of them; decommissioning ones and host-local copies take
    /// no block that counts); free is also at most what the metadata
    /// store's filesystem has left, since nothing can be created once that
    /// is full. An object store counts as its `-o s3_capacity=` (unbounded:
    /// [`UNBOUNDED`]) less the bytes of the filesystem's files, at most
    /// one replica of each of which it holds (docs/SEMANTICS.md,
    /// "Object-store datanodes", *Capacity*).
    pub fn statfs(&self) -> FsResult<Statfs> {
        let (files, bytes) = self.meta().usage()?;
        let bs = u64::from(Statfs::BLOCK_SIZE);
        let mut total = u64::MAX;
        let mut free = u64::MAX;
        for dn in self.dns().attached() {
            if !self.dns().counts(dn.id()) {
                continue;
            }
            let (t, f) = match dn.capacity() {
                Capacity::Fs { total, free } => (total, free),
                Capacity::Store { quota } => {
                    let t = quota.unwrap_or(UNBOUNDED);
                    (t, t.saturating_sub(bytes))
                }
                Capacity::Unknown => continue,
            };
            total = total.min(t / bs);
            free = free.min(f / bs);
        }
        if total == u64::MAX {
            total = 0;
            free = 0;
        }
        if let Some(m) = self.meta().space()? {
            free = free.min(m.avail_bytes / bs);
        }
        Ok(Statfs {
            blocks: total,
            free_blocks: free,
            files,
        })
    }
}
