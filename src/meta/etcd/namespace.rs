//! [`Namespace`] on etcd: each step runs its rule
//! ([`crate::meta::rules`]) on one [`Stm`] attempt, through the keys of
//! [`super::records`]. One entry is three keys (`d/` for lookups, `p/`
//! for the names of an inode, `o/` for listings), kept in step here.
//!
//! Every change of a directory entry also rewrites the directory's inode
//! (mtime, ctime, nlink), so a step that read a directory conflicts with
//! any concurrent change of its entries; reading an inode makes a
//! concurrent change of its attributes a conflict, so xattr limits hold
//! at the commit.

use super::EtcdMeta;
use super::records::*;
use super::stm::{Stm, prefix_end};
use crate::error::{FsError, FsResult};
use crate::meta::counters::{Counter, Counters};
use crate::meta::namespace::Namespace;
use crate::meta::rules::{self, Entry, Rename, Tx};
use crate::meta::types::*;

impl Tx for Stm<'_> {
    fn inode(&mut self, ino: u64) -> FsResult<Option<Inode>> {
        Ok(self.find_inode(ino)?.map(|r| r.inode))
    }

    fn entry(&mut self, parent: u64, name: &[u8]) -> FsResult<Option<Entry>> {
        Ok(self
            .get_json::<Dentry>(&dentry_key(parent, name))?
            .map(|d| Entry {
                ino: d.ino,
                cookie: d.cookie,
            }))
    }

    /// Reading the directory's inode as well (every rule does) makes any
    /// concurrent entry change in it a conflict, so emptiness holds at the
    /// commit.
    fn is_empty_dir(&mut self, dir: u64) -> FsResult<bool> {
        let p = dentries_of(dir);
        Ok(self.scan(&p, &prefix_end(&p), Some(1))?.is_empty())
    }

    /// Reads the `p/` names of `ino`, so a concurrent move of it (which
    /// adds a name there) conflicts with this attempt.
    fn first_parent(&mut self, ino: u64) -> FsResult<Option<u64>> {
        Ok(self.first_name(ino)?.map(|(p, _)| p))
    }

    /// The first in key order.
    fn first_name(&mut self, ino: u64) -> FsResult<Option<(u64, Vec<u8>)>> {
        let p = names_of(ino);
        match self.scan(&p, &prefix_end(&p), Some(1))?.first() {
            Some((k, _)) => Ok(Some(parse_name_key(k)?)),
            None => Ok(None),
        }
    }

    fn xattr(&mut self, ino: u64, name: &[u8]) -> FsResult<Option<Vec<u8>>> {
        self.get(&xattr_key(ino, name))
    }

    fn xattr_sizes(&mut self, ino: u64) -> FsResult<Vec<(Vec<u8>, u64)>> {
        let p = xattrs_of(ino);
        self.scan(&p, &prefix_end(&p), None)?
            .into_iter()
            .map(|(k, v)| Ok((name_in(&k)?, v.len() as u64)))
            .collect()
    }

    fn insert_inode(&mut self, i: &Inode, target: Option<&[u8]>) -> FsResult<()> {
        self.put_inode(&InodeRec {
            inode: i.clone(),
            target: target.map(hex),
        })
    }

    fn put_attrs(&mut self, i: &Inode) -> FsResult<()> {
        self.update_inode(i.ino, |x| {
            x.mode = i.mode;
            x.uid = i.uid;
            x.gid = i.gid;
            x.atime = i.atime;
            x.mtime = i.mtime;
            x.ctime = i.ctime;
        })
    }

    fn add_nlink(&mut self, ino: u64, delta: i64, ctime: i64) -> FsResult<()> {
        self.update_inode(ino, |i| {
            i.nlink = (i.nlink as i64 + delta).max(0) as u32;
            i.ctime = ctime;
        })
    }

    fn set_ctime(&mut self, ino: u64, ctime: i64) -> FsResult<()> {
        self.update_inode(ino, |i| i.ctime = ctime)
    }

    fn touch_dir(&mut self, dir: u64, nlink_delta: i64, now: i64) -> FsResult<()> {
        self.update_inode(dir, |i| {
            i.mtime = now;
            i.ctime = now;
            i.nlink = (i.nlink as i64 + nlink_delta).max(0) as u32;
        })
    }

    fn put_entry(
        &mut self,
        parent: u64,
        name: &[u8],
        e: Entry,
        kind: Kind,
        replacing: Option<Entry>,
    ) -> FsResult<()> {
        let d = Dentry {
            ino: e.ino,
            kind,
            cookie: e.cookie,
        };
        self.set_entry(parent, name, d, replacing)
    }

    fn remove_entry(&mut self, parent: u64, name: &[u8], e: Entry) -> FsResult<()> {
        self.delete(&dentry_key(parent, name));
        self.delete(&name_key(e.ino, parent, name));
        self.delete(&listed_key(parent, e.cookie));
        Ok(())
    }

    fn drop_inode(&mut self, ino: u64) -> FsResult<()> {
        self.delete(&inode_key(ino));
        let x = xattrs_of(ino);
        self.delete_range(&x, &prefix_end(&x));
        Ok(())
    }

    fn put_xattr(&mut self, ino: u64, name: &[u8], value: &[u8]) -> FsResult<()> {
        self.put(&xattr_key(ino, name), value.to_vec());
        Ok(())
    }

    fn remove_xattr(&mut self, ino: u64, name: &[u8]) -> FsResult<()> {
        self.delete(&xattr_key(ino, name));
        Ok(())
    }
}

impl Namespace for EtcdMeta {
    fn get(&self, ino: u64) -> FsResult<Inode> {
        self.run(|s| Ok(s.inode_rec(ino)?.inode))
    }

    fn lookup(&self, parent: u64, name: &[u8]) -> FsResult<Inode> {
        self.run(|s| rules::lookup(s, parent, name))
    }

    fn parent_of(&self, dir: u64) -> FsResult<u64> {
        if dir == ROOT_INO {
            // The rule's answer, without a round trip.
            return Ok(ROOT_INO);
        }
        self.run(|s| rules::parent_of(s, dir))
    }

    fn create(&self, parent: u64, name: &[u8], n: NewNode<'_>) -> FsResult<Inode> {
        // Outside the retried step: an attempt that runs again keeps its id.
        let ids = (self.alloc(Counter::Ino)?, self.alloc(Counter::Cookie)?);
        let now = now_ns();
        self.run(|s| rules::create(s, parent, name, &n, ids, now))
    }

    fn readlink(&self, ino: u64) -> FsResult<Vec<u8>> {
        let r = self.run(|s| s.inode_rec(ino))?;
        unhex(
            r.target
                .as_deref()
                .ok_or(FsError::Invalid("not a symlink".into()))?,
        )
    }

    fn link(&self, ino: u64, parent: u64, name: &[u8]) -> FsResult<Inode> {
        let now = now_ns();
        let cookie = self.alloc(Counter::Cookie)?;
        self.run(|s| rules::link(s, ino, (parent, name), cookie, now))
    }

    fn unlink(&self, parent: u64, name: &[u8]) -> FsResult<Inode> {
        let now = now_ns();
        self.run(|s| rules::unlink(s, parent, name, now))
    }

    fn rmdir(&self, parent: u64, name: &[u8]) -> FsResult<u64> {
        let now = now_ns();
        self.run(|s| rules::rmdir(s, parent, name, now))
    }

    fn rename(
        &self,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        noreplace: bool,
        exchange: bool,
    ) -> FsResult<Option<Inode>> {
        let now = now_ns();
        let r = Rename {
            parent,
            name,
            newparent,
            newname,
            noreplace,
            exchange,
        };
        self.run(|s| rules::rename(s, &r, now))
    }

    /// One range read of the directory's `o/` keys from the cookie on.
    fn readdir(&self, dir: u64, after: u64, limit: usize) -> FsResult<Vec<DirEntry>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let from = listed_key(dir, after.saturating_add(1));
        let end = prefix_end(&listing_of(dir));
        self.run(|s| {
            rules::require_dir(s, dir)?;
            s.scan(&from, &end, Some(limit))?
                .into_iter()
                .map(|(k, v)| {
                    let l: Listed = decode(&k, &v)?;
                    let cookie = k
                        .rsplit('/')
                        .next()
                        .and_then(|c| u64::from_str_radix(c, 16).ok())
                        .ok_or_else(|| FsError::Meta(format!("bad listing key {k}")))?;
                    Ok(DirEntry {
                        name: unhex(&l.name)?,
                        ino: l.ino,
                        kind: l.kind,
                        cookie,
                    })
                })
                .collect()
        })
    }

    fn set_attrs(&self, ino: u64, ch: &AttrChange) -> FsResult<Inode> {
        let now = now_ns();
        self.run(|s| rules::set_attrs(s, ino, ch, now))
    }

    fn path_of(&self, ino: u64) -> String {
        self.run(|s| rules::path_of(s, ino))
            .unwrap_or_else(|_| format!("<ino {ino}>"))
    }

    /// A scan of every inode: etcd has no secondary index on nlink.
    fn orphans(&self) -> FsResult<Vec<u64>> {
        self.run(|s| {
            Ok(s.scan_json::<InodeRec>(INODES)?
                .into_iter()
                .filter(|(_, r)| r.inode.nlink == 0)
                .map(|(_, r)| r.inode.ino)
                .collect())
        })
    }

    fn delete_inode(&self, ino: u64) -> FsResult<Vec<BlockRow>> {
        self.run(|s| super::blocks::delete_inode(s, ino))
    }

    /// A scan of every inode (paged, at one revision): fine for statfs on
    /// namespaces of up to a few hundred thousand files.
    fn usage(&self) -> FsResult<(u64, u64)> {
        self.run(|s| {
            let all = s.scan_json::<InodeRec>(INODES)?;
            Ok((
                all.len() as u64,
                all.iter().map(|(_, r)| r.inode.size).sum(),
            ))
        })
    }

    fn getxattr(&self, ino: u64, name: &[u8]) -> FsResult<Vec<u8>> {
        self.run(|s| s.get(&xattr_key(ino, name)))?
            .ok_or(FsError::NoXattr)
    }

    fn get_with_xattr(&self, ino: u64, name: &[u8]) -> FsResult<(Inode, Option<Vec<u8>>)> {
        self.run(|s| {
            let i = s.inode_rec(ino)?.inode;
            Ok((i, s.get(&xattr_key(ino, name))?))
        })
    }

    fn update_xattrs(
        &self,
        ino: u64,
        names: &[&[u8]],
        limits: XattrLimits,
        decide: &mut DecideXattrs<'_>,
    ) -> FsResult<Inode> {
        let now = now_ns();
        self.run(|s| rules::update_xattrs(s, ino, names, limits, &mut *decide, now))
    }

    fn listxattr(&self, ino: u64) -> FsResult<Vec<Vec<u8>>> {
        self.run(|s| {
            let p = xattrs_of(ino);
            s.scan(&p, &prefix_end(&p), None)?
                .into_iter()
                .map(|(k, _)| name_in(&k))
                .collect()
        })
    }
}
