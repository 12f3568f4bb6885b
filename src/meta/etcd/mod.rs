//! [`EtcdMeta`]: the namespace and block lists in etcd, shared by every
//! daemon that mounts the same filesystem name.
//!
//! Each [`Meta`] method is one optimistic transaction ([`stm`]): it reads at
//! one snapshot revision, then commits all its writes in one etcd Txn that
//! asserts nothing it read has changed, and runs again if another daemon
//! changed it first. Every change of a directory entry also rewrites the
//! directory's inode (mtime, ctime, nlink), so a step that read a directory
//! conflicts with any concurrent change of its entries. The key layout is in
//! [`records`].
//!
//! etcd commits are durable on a quorum when they return, so `durable`
//! commits and `sync_if_needed` need nothing more.

mod data;
mod namespace;
mod records;
mod stm;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use records::*;
use stm::prefix_end;

use super::backend::{Change, Meta};
use super::types::*;
use crate::error::{FsError, FsResult};
use crate::etcd::Etcd;
use crate::sync::{Mutex, lock};

/// How many ids one reservation on a counter takes.
const ID_BATCH: u64 = 1024;

/// The counters and their first values on a new filesystem (as in SQLite).
const COUNTERS: [(&str, u64); 5] = [
    ("next_ino", 2),
    ("next_block", 1),
    ("next_gs", 1000),
    ("epoch_reserved", 0),
    ("next_cookie", FIRST_COOKIE),
];

/// The key layout this code writes; `layout` counter values below it are
/// upgraded at open.
const LAYOUT: u64 = 2;

pub struct EtcdMeta {
    etcd: Arc<Etcd>,
    /// Ranges of ids this process reserved on each counter: (next, end).
    /// Reservations are compare-and-swap on the counter, so ranges of
    /// different daemons never overlap.
    pool: Mutex<HashMap<&'static str, (u64, u64)>>,
}

impl EtcdMeta {
    /// Opens the filesystem under `etcd`'s prefix, creating the root
    /// directory (owned by `uid:gid`) and the counters unless another
    /// daemon already did.
    pub fn open(etcd: Arc<Etcd>, uid: u32, gid: u32) -> FsResult<EtcdMeta> {
        let now = now_ns();
        stm::run(&etcd, |s| {
            if s.find_inode(ROOT_INO)?.is_none() {
                s.put_inode(&InodeRec {
                    inode: Inode {
                        ino: ROOT_INO,
                        kind: Kind::Dir,
                        mode: 0o755,
                        uid,
                        gid,
                        nlink: 2,
                        size: 0,
                        rdev: 0,
                        atime: now,
                        mtime: now,
                        ctime: now,
                        crtime: now,
                        block_size: 0,
                        last_epoch: 0,
                    },
                    target: None,
                })?;
            }
            for (name, first) in COUNTERS {
                if s.counter(name)?.is_none() {
                    s.set_counter(name, first);
                }
            }
            if s.get(FILESYSTEM_ID)?.is_none() {
                s.put(
                    FILESYSTEM_ID,
                    crate::storage::identity::new_filesystem_id().into_bytes(),
                );
            }
            data::upgrade_positional_datanodes(s)
        })?;
        let me = EtcdMeta {
            etcd,
            pool: Mutex::new(HashMap::new()),
        };
        me.upgrade()?;
        Ok(me)
    }

    /// Gives every directory entry written before listing cookies existed
    /// (layout 1) its cookie and its `o/` listing key, a page of entries
    /// per step. Steps are idempotent, so daemons mounting at once may
    /// share the work.
    fn upgrade(&self) -> FsResult<()> {
        if self.run(|s| s.counter("layout"))?.unwrap_or(1) >= LAYOUT {
            return Ok(());
        }
        // Three keys written per entry, within etcd's 128 operations.
        const PAGE: usize = 40;
        let mut from = "d/".to_string();
        let end = prefix_end("d/");
        loop {
            let next = self.run(|s| {
                let page = s.scan(&from, &end, Some(PAGE))?;
                let mut cookie = s.counter("next_cookie")?.unwrap_or(FIRST_COOKIE);
                for (k, v) in &page {
                    let mut d: Dentry = decode(k, v)?;
                    if d.cookie != 0 {
                        continue;
                    }
                    let (parent, name) = parse_name_key(k)?;
                    d.cookie = cookie;
                    cookie += 1;
                    s.set_entry(parent, &name, d, None)?;
                }
                s.set_counter("next_cookie", cookie);
                let last = page.last().filter(|_| page.len() == PAGE);
                Ok(last.map(|(k, _)| format!("{k}\0")))
            })?;
            match next {
                Some(k) => from = k,
                None => break,
            }
        }
        self.run(|s| {
            s.set_counter("layout", LAYOUT);
            Ok(())
        })
    }

    fn run<T>(&self, f: impl FnMut(&mut stm::Stm<'_>) -> FsResult<T>) -> FsResult<T> {
        stm::run(&self.etcd, f)
    }

    /// Adds `n` to a counter; returns its value before.
    fn add_to_counter(&self, name: &str, n: u64) -> FsResult<u64> {
        self.run(|s| {
            let v = s
                .counter(name)?
                .ok_or_else(|| FsError::Meta(format!("etcd counter {name} is missing")))?;
            s.set_counter(name, v + n);
            Ok(v)
        })
    }

    fn scan_blocks(&self, prefix: &str) -> FsResult<Vec<BlockRow>> {
        self.run(|s| {
            Ok(s.scan_json::<BlockRow>(prefix)?
                .into_iter()
                .map(|(_, b)| b)
                .collect())
        })
    }
}

impl Meta for EtcdMeta {
    fn backend(&self) -> &'static str {
        "etcd"
    }

    fn get(&self, ino: u64) -> FsResult<Inode> {
        self.run(|s| Ok(s.inode(ino)?.inode))
    }

    fn lookup(&self, parent: u64, name: &[u8]) -> FsResult<Inode> {
        self.run(|s| {
            s.require_dir(parent)?;
            let d = s.lookup_in(parent, name)?.ok_or(FsError::NotFound)?;
            Ok(s.inode(d.ino)?.inode)
        })
    }

    fn parent_of(&self, dir: u64) -> FsResult<u64> {
        if dir == ROOT_INO {
            return Ok(ROOT_INO);
        }
        self.run(|s| Ok(s.first_name(dir)?.map_or(ROOT_INO, |(p, _)| p)))
    }

    fn create(&self, parent: u64, name: &[u8], n: NewNode<'_>) -> FsResult<Inode> {
        // Outside the retried step: an attempt that runs again keeps its id.
        let ids = namespace::Ids {
            ino: self.alloc("next_ino")?,
            cookie: self.alloc("next_cookie")?,
        };
        let now = now_ns();
        self.run(|s| namespace::create(s, parent, name, &n, &ids, now))
    }

    fn readlink(&self, ino: u64) -> FsResult<Vec<u8>> {
        let r = self.run(|s| s.inode(ino))?;
        unhex(
            r.target
                .as_deref()
                .ok_or(FsError::Invalid("not a symlink".into()))?,
        )
    }

    fn link(&self, ino: u64, parent: u64, name: &[u8]) -> FsResult<Inode> {
        let now = now_ns();
        let cookie = self.alloc("next_cookie")?;
        self.run(|s| namespace::link(s, ino, (parent, name), cookie, now))
    }

    fn unlink(&self, parent: u64, name: &[u8]) -> FsResult<Inode> {
        let now = now_ns();
        self.run(|s| namespace::unlink(s, parent, name, now))
    }

    fn rmdir(&self, parent: u64, name: &[u8]) -> FsResult<u64> {
        let now = now_ns();
        self.run(|s| namespace::rmdir(s, parent, name, now))
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
        let r = namespace::Rename {
            parent,
            name,
            newparent,
            newname,
            noreplace,
            exchange,
        };
        self.run(|s| namespace::rename(s, &r, now))
    }

    /// One range read of the directory's `o/` keys from the cookie on.
    fn readdir(&self, dir: u64, after: u64, limit: usize) -> FsResult<Vec<DirEntry>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let from = listed_key(dir, after.saturating_add(1));
        let end = prefix_end(&listing_of(dir));
        self.run(|s| {
            s.require_dir(dir)?;
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
        self.run(|s| namespace::set_attrs(s, ino, ch, now))
    }

    fn path_of(&self, ino: u64) -> String {
        self.run(|s| namespace::path_of(s, ino))
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
        self.run(|s| data::delete_inode(s, ino))
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

    fn get_with_xattr(&self, ino: u64, name: &[u8]) -> FsResult<(Inode, bool)> {
        self.run(|s| {
            let i = s.inode(ino)?.inode;
            Ok((i, s.get(&xattr_key(ino, name))?.is_some()))
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
        self.run(|s| namespace::update_xattrs(s, ino, names, limits, &mut *decide, now))
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

    /// etcd keeps its data on its own servers: their space is etcd's
    /// quota, not a local filesystem.
    fn space(&self) -> FsResult<Option<StoreSpace>> {
        Ok(None)
    }

    /// One Txn; etcd has made it durable on a quorum when it returns, so
    /// `durable` needs nothing more.
    fn commit(&self, changes: &[Change], _durable: bool) -> FsResult<Vec<BlockRow>> {
        self.run(|s| data::commit(s, changes))
    }

    fn sync_if_needed(&self) -> FsResult<()> {
        Ok(())
    }

    fn blocks(&self, ino: u64) -> FsResult<Vec<BlockRow>> {
        self.scan_blocks(&blocks_of(ino))
    }

    fn all_blocks(&self) -> FsResult<Vec<BlockRow>> {
        self.scan_blocks(BLOCKS)
    }

    fn block_by_id(&self, block_id: u64) -> FsResult<Option<BlockRow>> {
        self.run(|s| data::block_by_id(s, block_id))
    }

    fn uc(&self, ino: u64) -> FsResult<Option<UnderConstruction>> {
        self.run(|s| s.get_json(&uc_key(ino)))
    }

    fn list_uc(&self) -> FsResult<Vec<UnderConstruction>> {
        self.run(|s| {
            Ok(s.scan_json::<UnderConstruction>(UCS)?
                .into_iter()
                .map(|(_, u)| u)
                .collect())
        })
    }

    /// Hands out ids from a range reserved with one compare-and-swap per
    /// [`ID_BATCH`] ids, so that allocation rarely costs a round trip.
    fn alloc(&self, counter: &'static str) -> FsResult<u64> {
        let mut pool = lock(&self.pool);
        let (next, end) = pool.entry(counter).or_insert((0, 0));
        if *next >= *end {
            let first = self.add_to_counter(counter, ID_BATCH)?;
            *next = first;
            *end = first + ID_BATCH;
        }
        let id = *next;
        *next += 1;
        Ok(id)
    }

    fn reserve_epochs(&self, n: u64) -> FsResult<u64> {
        Ok(self.add_to_counter("epoch_reserved", n)? + 1)
    }

    fn filesystem_id(&self) -> FsResult<String> {
        let v = self
            .run(|s| s.get(FILESYSTEM_ID))?
            .ok_or_else(|| FsError::Meta("the filesystem ID is missing in etcd".into()))?;
        String::from_utf8(v).map_err(|_| FsError::Meta("corrupt filesystem ID in etcd".into()))
    }

    fn datanode_records(&self) -> FsResult<Vec<DatanodeRecord>> {
        self.run(|s| {
            Ok(s.scan_json::<DatanodeRecord>(DATANODES)?
                .into_iter()
                .map(|(_, r)| r)
                .collect())
        })
    }

    fn register_datanode(&self, storage_id: &str, path: &Path) -> FsResult<DnId> {
        self.run(|s| data::register_datanode(s, storage_id, path))
    }

    fn claim_legacy_datanode(&self, id: DnId, storage_id: &str) -> FsResult<String> {
        self.run(|s| data::claim_legacy_datanode(s, id, storage_id))
    }

    fn set_datanode_state(
        &self,
        id: DnId,
        from: &[AdminState],
        to: AdminState,
    ) -> FsResult<AdminState> {
        self.run(|s| data::set_datanode_state(s, id, from, to))
    }

    /// The tombstone first (one transaction), then the rows that list the
    /// datanode, a page per transaction.
    fn remove_datanode(&self, id: DnId) -> FsResult<()> {
        self.run(|s| {
            data::set_datanode_state(
                s,
                id,
                &[
                    AdminState::Upgrading,
                    AdminState::Normal,
                    AdminState::Decommissioning,
                    AdminState::Decommissioned,
                    AdminState::Removed,
                ],
                AdminState::Removed,
            )
        })?;
        let keys: Vec<(u64, u64)> = self
            .all_blocks()?
            .into_iter()
            .filter(|b| b.replicas.contains(&id))
            .map(|b| (b.ino, b.idx))
            .collect();
        for page in keys.chunks(data::SCRUB_PAGE) {
            self.run(|s| data::scrub_rows(s, id, page))?;
        }
        Ok(())
    }

    fn set_replication(&self, replication: usize) -> FsResult<()> {
        self.run(|s| {
            s.set_counter(data::REPLICATION, replication as u64);
            Ok(())
        })
    }

    fn replication(&self) -> FsResult<Option<usize>> {
        Ok(self
            .run(|s| s.counter(data::REPLICATION))?
            .map(|r| r as usize))
    }

    /// Sequence numbers come from one counter, so they order the events of
    /// all daemons as their commits did. The election's events are read in
    /// the same transaction: a concurrent event makes it run again, so the
    /// redundancy check cannot miss one.
    fn audit(&self, e: &AuditEvent) -> FsResult<Option<i64>> {
        self.run(|s| {
            let history: Vec<AuditEvent> = s
                .scan_json::<AuditEvent>(&audit_of(&e.election))?
                .into_iter()
                .map(|(_, e)| e)
                .collect();
            if e.is_redundant(&history) {
                return Ok(None);
            }
            let seq = s.counter("audit_seq")?.unwrap_or(0) + 1;
            s.set_counter("audit_seq", seq);
            s.put_json(&audit_key(&e.election, seq), e)?;
            Ok(Some(seq as i64))
        })
    }

    fn put_fence(&self, f: &FenceRecord) -> FsResult<()> {
        self.run(|s| s.put_json(&fence_key(&f.owner, f.pgid), f))
    }

    fn delete_fence(&self, owner: &str, pgid: u32) -> FsResult<()> {
        self.run(|s| {
            s.delete(&fence_key(owner, pgid));
            Ok(())
        })
    }

    fn fences(&self, owner: &str) -> FsResult<Vec<FenceRecord>> {
        self.run(|s| {
            Ok(s.scan_json::<FenceRecord>(&fences_of(owner))?
                .into_iter()
                .map(|(_, f)| f)
                .collect())
        })
    }

    fn audit_history(&self, election: &str) -> FsResult<Vec<AuditEvent>> {
        self.run(|s| {
            Ok(s.scan_json::<AuditEvent>(&audit_of(election))?
                .into_iter()
                .map(|(_, e)| e)
                .collect())
        })
    }
}
