//! An in-memory [`Tx`] and a namespace over it, so the rules are tested
//! without a backend: every step runs on maps, with the ids a backend
//! would allocate, at a time that rises by 1000 per step.

use std::collections::BTreeMap;

use super::{Entry, Rename, Tx};
use crate::error::FsResult;
use crate::meta::types::*;

#[derive(Debug, Default, Clone)]
pub(super) struct Mem {
    inodes: BTreeMap<u64, (Inode, Option<Vec<u8>>)>,
    entries: BTreeMap<(u64, Vec<u8>), Entry>,
    xattrs: BTreeMap<(u64, Vec<u8>), Vec<u8>>,
    next_ino: u64,
    next_cookie: u64,
    clock: i64,
}

impl Tx for Mem {
    fn inode(&mut self, ino: u64) -> FsResult<Option<Inode>> {
        Ok(self.inodes.get(&ino).map(|(i, _)| i.clone()))
    }
    fn entry(&mut self, parent: u64, name: &[u8]) -> FsResult<Option<Entry>> {
        Ok(self.entries.get(&(parent, name.to_vec())).copied())
    }
    fn is_empty_dir(&mut self, dir: u64) -> FsResult<bool> {
        Ok(!self.entries.keys().any(|(p, _)| *p == dir))
    }
    fn first_parent(&mut self, ino: u64) -> FsResult<Option<u64>> {
        Ok(self.first_name(ino)?.map(|(p, _)| p))
    }
    fn first_name(&mut self, ino: u64) -> FsResult<Option<(u64, Vec<u8>)>> {
        Ok(self
            .entries
            .iter()
            .find(|(_, e)| e.ino == ino)
            .map(|((p, n), _)| (*p, n.clone())))
    }
    fn xattr(&mut self, ino: u64, name: &[u8]) -> FsResult<Option<Vec<u8>>> {
        Ok(self.xattrs.get(&(ino, name.to_vec())).cloned())
    }
    fn xattr_sizes(&mut self, ino: u64) -> FsResult<Vec<(Vec<u8>, u64)>> {
        Ok(self
            .xattrs
            .iter()
            .filter(|((i, _), _)| *i == ino)
            .map(|((_, n), v)| (n.clone(), v.len() as u64))
            .collect())
    }
    fn insert_inode(&mut self, i: &Inode, target: Option<&[u8]>) -> FsResult<()> {
        self.inodes
            .insert(i.ino, (i.clone(), target.map(<[u8]>::to_vec)));
        Ok(())
    }
    fn put_attrs(&mut self, i: &Inode) -> FsResult<()> {
        self.update(i.ino, |x| {
            x.mode = i.mode;
            x.uid = i.uid;
            x.gid = i.gid;
            x.atime = i.atime;
            x.mtime = i.mtime;
            x.ctime = i.ctime;
        });
        Ok(())
    }
    fn add_nlink(&mut self, ino: u64, delta: i64, ctime: i64) -> FsResult<()> {
        self.update(ino, |i| {
            i.nlink = (i.nlink as i64 + delta).max(0) as u32;
            i.ctime = ctime;
        });
        Ok(())
    }
    fn set_ctime(&mut self, ino: u64, ctime: i64) -> FsResult<()> {
        self.update(ino, |i| i.ctime = ctime);
        Ok(())
    }
    fn touch_dir(&mut self, dir: u64, nlink_delta: i64, now: i64) -> FsResult<()> {
        self.update(dir, |i| {
            i.mtime = now;
            i.ctime = now;
            i.nlink = (i.nlink as i64 + nlink_delta).max(0) as u32;
        });
        Ok(())
    }
    fn put_entry(
        &mut self,
        parent: u64,
        name: &[u8],
        e: Entry,
        _kind: Kind,
        _replacing: Option<Entry>,
    ) -> FsResult<()> {
        self.entries.insert((parent, name.to_vec()), e);
        Ok(())
    }
    fn remove_entry(&mut self, parent: u64, name: &[u8], _e: Entry) -> FsResult<()> {
        self.entries.remove(&(parent, name.to_vec()));
        Ok(())
    }
    fn drop_inode(&mut self, ino: u64) -> FsResult<()> {
        self.inodes.remove(&ino);
        self.xattrs.retain(|(i, _), _| *i != ino);
        Ok(())
    }
    fn put_xattr(&mut self, ino: u64, name: &[u8], value: &[u8]) -> FsResult<()> {
        self.xattrs.insert((ino, name.to_vec()), value.to_vec());
        Ok(())
    }
    fn remove_xattr(&mut self, ino: u64, name: &[u8]) -> FsResult<()> {
        self.xattrs.remove(&(ino, name.to_vec()));
        Ok(())
    }
}

/// The steps a backend offers, each one rule on the maps.
impl Mem {
    pub(super) fn new() -> Mem {
        let mut m = Mem {
            next_ino: 2,
            next_cookie: FIRST_COOKIE,
            ..Mem::default()
        };
        let root = Inode {
            ino: ROOT_INO,
            kind: Kind::Dir,
            mode: 0o755,
            uid: 0,
            gid: 0,
            nlink: 2,
            size: 0,
            rdev: 0,
            atime: 0,
            mtime: 0,
            ctime: 0,
            crtime: 0,
            block_size: 0,
            last_epoch: 0,
        };
        m.inodes.insert(ROOT_INO, (root, None));
        m
    }

    fn update(&mut self, ino: u64, f: impl FnOnce(&mut Inode)) {
        if let Some((i, _)) = self.inodes.get_mut(&ino) {
            f(i);
        }
    }

    fn now(&mut self) -> i64 {
        self.clock += 1000;
        self.clock
    }

    fn cookie(&mut self) -> u64 {
        self.next_cookie += 1;
        self.next_cookie - 1
    }

    pub(super) fn get(&mut self, ino: u64) -> FsResult<Inode> {
        super::inode(self, ino)
    }
    pub(super) fn lookup(&mut self, parent: u64, name: &[u8]) -> FsResult<Inode> {
        super::lookup(self, parent, name)
    }
    pub(super) fn create(&mut self, parent: u64, name: &[u8], n: NewNode<'_>) -> FsResult<Inode> {
        let ids = (self.next_ino, self.cookie());
        self.next_ino += 1;
        let now = self.now();
        super::create(self, parent, name, &n, ids, now)
    }
    pub(super) fn link(&mut self, ino: u64, parent: u64, name: &[u8]) -> FsResult<Inode> {
        let cookie = self.cookie();
        let now = self.now();
        super::link(self, ino, (parent, name), cookie, now)
    }
    pub(super) fn unlink(&mut self, parent: u64, name: &[u8]) -> FsResult<Inode> {
        let now = self.now();
        super::unlink(self, parent, name, now)
    }
    pub(super) fn rmdir(&mut self, parent: u64, name: &[u8]) -> FsResult<u64> {
        let now = self.now();
        super::rmdir(self, parent, name, now)
    }
    pub(super) fn rename(
        &mut self,
        (parent, name): (u64, &[u8]),
        (newparent, newname): (u64, &[u8]),
        noreplace: bool,
        exchange: bool,
    ) -> FsResult<Option<Inode>> {
        let now = self.now();
        let r = Rename {
            parent,
            name,
            newparent,
            newname,
            noreplace,
            exchange,
        };
        super::rename(self, &r, now)
    }
    pub(super) fn set_attrs(&mut self, ino: u64, ch: &AttrChange) -> FsResult<Inode> {
        let now = self.now();
        super::set_attrs(self, ino, ch, now)
    }
    pub(super) fn update_xattrs(
        &mut self,
        ino: u64,
        names: &[&[u8]],
        limits: XattrLimits,
        decide: &mut DecideXattrs<'_>,
    ) -> FsResult<Inode> {
        let now = self.now();
        super::update_xattrs(self, ino, names, limits, decide, now)
    }
    pub(super) fn setxattr(
        &mut self,
        ino: u64,
        name: &[u8],
        value: &[u8],
        (create, replace): (bool, bool),
    ) -> FsResult<()> {
        self.update_xattrs(ino, &[name], XattrLimits::NONE, &mut |_, cur| {
            super::xattrs::set_one(&cur[0], name, value, create, replace)
        })
        .map(drop)
    }
    pub(super) fn removexattr(&mut self, ino: u64, name: &[u8]) -> FsResult<()> {
        self.update_xattrs(ino, &[name], XattrLimits::NONE, &mut |_, cur| {
            super::xattrs::remove_one(&cur[0], name)
        })
        .map(drop)
    }
    pub(super) fn getxattr(&self, ino: u64, name: &[u8]) -> Option<Vec<u8>> {
        self.xattrs.get(&(ino, name.to_vec())).cloned()
    }
    pub(super) fn xattr_names(&self, ino: u64) -> Vec<Vec<u8>> {
        self.xattrs
            .keys()
            .filter(|(i, _)| *i == ino)
            .map(|(_, n)| n.clone())
            .collect()
    }
    pub(super) fn parent_of(&mut self, dir: u64) -> FsResult<u64> {
        super::parent_of(self, dir)
    }
    pub(super) fn path_of(&mut self, ino: u64) -> String {
        super::path_of(self, ino).unwrap_or_else(|_| format!("<ino {ino}>"))
    }
    /// The entries of `dir` as (name, ino, cookie), in listing order.
    pub(super) fn list(&self, dir: u64) -> Vec<(Vec<u8>, u64, u64)> {
        let mut v: Vec<_> = self
            .entries
            .iter()
            .filter(|((p, _), _)| *p == dir)
            .map(|((_, n), e)| (n.clone(), e.ino, e.cookie))
            .collect();
        v.sort_by_key(|e| e.2);
        v
    }
    /// Whether inodes, entries and attributes are as in `other`.
    pub(super) fn same_tree(&self, other: &Mem) -> bool {
        (self.inodes == other.inodes)
            && (self.entries == other.entries)
            && (self.xattrs == other.xattrs)
    }
}
