//! Namespace operations of [`Core`]: thin rules over the metadata store
//! (ownership of new nodes, when an unlinked file really goes) and the
//! virtual `user.leasefs.*` attributes.

use super::attr::Attr;
use super::core::{Caller, Core};
use crate::error::{FsError, FsResult};
use crate::meta::{AttrChange, Inode, Kind, NewNode, ROOT_INO};

pub const XATTR_LEASE: &str = "user.leasefs.lease";
pub const XATTR_EPOCH: &str = "user.leasefs.epoch";
pub const XATTR_STREAM: &str = "user.leasefs.stream";
pub const XATTR_DATA: &str = "user.leasefs.data";
/// On the mount root: the soft limit in milliseconds, so clients that renew
/// their own leases (spout, elect) can pick a safe renewal interval.
pub const XATTR_SOFT_LIMIT: &str = "user.leasefs.soft_limit_ms";

const NAME_MAX: usize = 255;

/// What `mknode` creates.
pub struct Node {
    pub kind: Kind,
    pub mode: u32,
    pub rdev: u32,
    /// A symlink's target.
    pub target: Option<Vec<u8>>,
}

fn check_name(name: &[u8]) -> FsResult<()> {
    if name.len() > NAME_MAX {
        return Err(FsError::NameTooLong);
    }
    Ok(())
}

impl Core {
    pub fn lookup(&self, parent: u64, name: &[u8]) -> FsResult<Attr> {
        check_name(name)?;
        let i = self.meta.lookup(parent, name)?;
        self.getattr(i.ino)
    }

    /// Creates a node owned by the caller; in a setgid directory it takes
    /// the directory's group (and a new directory keeps the setgid bit).
    pub fn mknode(&self, parent: u64, name: &[u8], node: Node, caller: Caller) -> FsResult<Attr> {
        let Node {
            kind,
            mode,
            rdev,
            target,
        } = node;
        self.may_change(caller)?;
        check_name(name)?;
        let dir = self.meta.get(parent)?;
        let mut mode = mode & 0o7777;
        let gid = if dir.mode & libc::S_ISGID != 0 {
            if kind == Kind::Dir {
                mode |= libc::S_ISGID;
            }
            dir.gid
        } else {
            caller.gid
        };
        let i = self.meta.create(
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
            },
        )?;
        Ok(Attr::from_inode(&i))
    }

    pub fn link(&self, ino: u64, parent: u64, name: &[u8], caller: Caller) -> FsResult<Attr> {
        self.may_change(caller)?;
        check_name(name)?;
        let i = self.meta.link(ino, parent, name)?;
        self.getattr(i.ino)
    }

    /// Removes a name; the file itself goes when its last name and last
    /// open handle are both gone.
    pub fn unlink(&self, parent: u64, name: &[u8], caller: Caller) -> FsResult<()> {
        self.may_change(caller)?;
        let i = self.meta.unlink(parent, name)?;
        self.forget_if_unlinked(&i);
        Ok(())
    }

    fn forget_if_unlinked(&self, i: &Inode) {
        if i.nlink == 0 && !self.is_open(i.ino) {
            self.delete_inode(i.ino);
        }
    }

    pub fn rmdir(&self, parent: u64, name: &[u8], caller: Caller) -> FsResult<()> {
        self.may_change(caller)?;
        self.meta.rmdir(parent, name).map(|_| ())
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
            .meta
            .rename(parent, name, newparent, newname, noreplace, exchange)?
        {
            self.forget_if_unlinked(&i);
        }
        Ok(())
    }

    pub fn readlink(&self, ino: u64) -> FsResult<Vec<u8>> {
        self.meta.readlink(ino)
    }

    /// `.` and `..` followed by the entries, as (name, ino, kind).
    pub fn readdir(&self, ino: u64) -> FsResult<Vec<(Vec<u8>, u64, Kind)>> {
        let mut v = vec![
            (b".".to_vec(), ino, Kind::Dir),
            (b"..".to_vec(), self.meta.parent_of(ino)?, Kind::Dir),
        ];
        v.extend(self.meta.readdir(ino)?);
        Ok(v)
    }

    /// chmod/chown/utimens. Ownership changes by a non-root caller clear
    /// setuid/setgid, as on local filesystems.
    pub fn set_attrs(&self, ino: u64, mut ch: AttrChange, caller: Caller) -> FsResult<Attr> {
        self.may_change(caller)?;
        if ch.uid.is_some() || ch.gid.is_some() {
            let cur = self.meta.get(ino)?;
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
            (Some(m), Some(stream)) => stream.set_mtime(m, || self.meta.set_attrs(ino, &ch))?,
            _ => self.meta.set_attrs(ino, &ch)?,
        };
        let mut a = self.getattr(i.ino)?;
        a.ctime = i.ctime;
        Ok(a)
    }

    pub fn getxattr(&self, ino: u64, name: &[u8]) -> FsResult<Vec<u8>> {
        match std::str::from_utf8(name).unwrap_or("") {
            XATTR_LEASE => {
                let mut info = self.leases.info(ino);
                info.epoch = self.last_epoch(ino)?;
                let free = info.state == crate::lease::LeaseState::Free;
                let mut v = serde_json::to_value(&info).map_err(|e| FsError::Io(e.to_string()))?;
                // Free here, but maybe held on another daemon of the
                // namespace: shown with the daemon that holds it.
                let remote = match &self.cluster {
                    Some(cl) if free => cl.remote_holder(ino),
                    _ => None,
                };
                if let Some(o) = v.as_object_mut() {
                    o.remove("file");
                    if let Some(c) = remote {
                        o.insert("state".into(), "held".into());
                        o.insert("holder".into(), format!("{}:{}", c.host, c.pid).into());
                        o.insert("comm".into(), c.comm.into());
                        o.insert("opened_wall_ms".into(), c.since_ms.into());
                        o.insert("daemon".into(), c.mount_id.into());
                    }
                }
                Ok(v.to_string().into_bytes())
            }
            XATTR_EPOCH => Ok(self.last_epoch(ino)?.to_string().into_bytes()),
            XATTR_STREAM => self
                .stream_stats_json(ino)
                .map(String::into_bytes)
                .ok_or(FsError::NoXattr),
            XATTR_DATA if ino == ROOT_INO => {
                Ok(self.data_dir.to_string_lossy().into_owned().into_bytes())
            }
            XATTR_SOFT_LIMIT if ino == ROOT_INO => {
                Ok(self.opts.soft_limit.as_millis().to_string().into_bytes())
            }
            _ => self.meta.getxattr(ino, name),
        }
    }

    fn is_virtual(name: &[u8]) -> bool {
        name.starts_with(b"user.leasefs.")
    }

    pub fn setxattr(
        &self,
        ino: u64,
        name: &[u8],
        value: &[u8],
        flags: i32,
        caller: Caller,
    ) -> FsResult<()> {
        self.may_change(caller)?;
        if Self::is_virtual(name) {
            return Err(FsError::NotPermitted(
                "user.leasefs.* attributes are read-only",
            ));
        }
        if value.len() > 65536 {
            return Err(FsError::Range);
        }
        self.meta.setxattr(
            ino,
            name,
            value,
            flags & libc::XATTR_CREATE != 0,
            flags & libc::XATTR_REPLACE != 0,
        )
    }

    pub fn listxattr(&self, ino: u64) -> FsResult<Vec<Vec<u8>>> {
        let mut v = Vec::new();
        if self.meta.get(ino)?.kind == Kind::File {
            v.push(XATTR_LEASE.as_bytes().to_vec());
            v.push(XATTR_EPOCH.as_bytes().to_vec());
        }
        v.extend(self.meta.listxattr(ino)?);
        Ok(v)
    }

    pub fn removexattr(&self, ino: u64, name: &[u8], caller: Caller) -> FsResult<()> {
        self.may_change(caller)?;
        if Self::is_virtual(name) {
            return Err(FsError::NotPermitted(
                "user.leasefs.* attributes are read-only",
            ));
        }
        self.meta.removexattr(ino, name)
    }

    /// (total blocks, free blocks, files) in 4 KiB blocks, from the
    /// fullest live datanode (every block needs room on several of them).
    pub fn statfs(&self) -> FsResult<(u64, u64, u64)> {
        let (files, _) = self.meta.usage()?;
        let mut total = u64::MAX;
        let mut free = u64::MAX;
        for i in 0..self.dns.len() {
            if let Some(dn) = self.dns.get(i)
                && let Ok(s) = nix::sys::statvfs::statvfs(&dn.root)
            {
                let f = s.fragment_size();
                total = total.min(s.blocks() * f / 4096);
                free = free.min(s.blocks_available() * f / 4096);
            }
        }
        if total == u64::MAX {
            total = 0;
            free = 0;
        }
        Ok((total, free, files))
    }
}
