//! [`EtcdMeta`]: every part of the metadata in etcd, shared by every
//! daemon that mounts the same filesystem name.
//!
//! Each step of the narrow interfaces is one optimistic transaction
//! ([`stm`]): it reads at one snapshot revision, then commits all its
//! writes in one etcd Txn that asserts nothing it read has changed, and
//! runs again if another daemon changed it first. The key layout is in
//! [`records`]; the interfaces are implemented in `namespace.rs` (over the
//! rules' `Tx`), `blocks.rs`, `audit.rs` and `registry.rs`, the counters
//! here.
//!
//! etcd commits are durable on a quorum when they return, so `durable`
//! commits and `sync_if_needed` need nothing more.

mod audit;
mod blocks;
mod namespace;
mod records;
mod registry;
mod stm;

use std::sync::Arc;

use records::*;
use stm::prefix_end;

use super::backend::Meta;
use super::counters::{Counter, Counters, IdPool};
use super::types::*;
use crate::error::{FsError, FsResult};
use crate::etcd::Etcd;
use crate::sync::{Mutex, lock};

/// How many ids one reservation on a counter takes.
const ID_BATCH: u64 = 1024;

/// The counter of the epoch high-water mark.
const EPOCHS: &str = "epoch_reserved";

/// The key layout this code writes; `layout` counter values below it are
/// upgraded at open.
const LAYOUT: u64 = 2;

pub struct EtcdMeta {
    etcd: Arc<Etcd>,
    /// Ranges of ids this process reserved on each counter. Reservations
    /// are compare-and-swap on the counter, so ranges of different daemons
    /// never overlap.
    pool: Mutex<IdPool>,
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
            for c in Counter::ALL {
                if s.counter(c.key())?.is_none() {
                    s.set_counter(c.key(), c.first());
                }
            }
            if s.counter(EPOCHS)?.is_none() {
                s.set_counter(EPOCHS, 0);
            }
            if s.get(FILESYSTEM_ID)?.is_none() {
                s.put(
                    FILESYSTEM_ID,
                    crate::storage::identity::new_filesystem_id().into_bytes(),
                );
            }
            registry::upgrade_positional_datanodes(s)
        })?;
        let me = EtcdMeta {
            etcd,
            pool: Mutex::new(IdPool::default()),
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
                let mut cookie = s.counter(Counter::Cookie.key())?.unwrap_or(FIRST_COOKIE);
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
                s.set_counter(Counter::Cookie.key(), cookie);
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
}

impl Meta for EtcdMeta {
    fn backend(&self) -> &'static str {
        "etcd"
    }

    /// etcd keeps its data on its own servers: their space is etcd's
    /// quota, not a local filesystem.
    fn space(&self) -> FsResult<Option<StoreSpace>> {
        Ok(None)
    }
}

impl Counters for EtcdMeta {
    /// Hands out ids from a range reserved with one compare-and-swap per
    /// [`ID_BATCH`] ids, so that allocation rarely costs a round trip;
    /// except generation stamps, one compare-and-swap each. A stamp must
    /// say which state of a block is newer whichever daemon made it (a
    /// replica above the record is one the metadata never recorded, below
    /// it one that lags): from per-daemon ranges, daemon B's later stamp
    /// could be below daemon A's earlier one. Only the holder of a file's
    /// claim allocates stamps for it, after taking the claim, so stamps in
    /// allocation order are stamps in the order of the block's states.
    fn alloc(&self, counter: Counter) -> FsResult<u64> {
        if counter == Counter::GenStamp {
            return self.add_to_counter(counter.key(), 1);
        }
        lock(&self.pool).take(counter, ID_BATCH, || {
            self.add_to_counter(counter.key(), ID_BATCH)
        })
    }

    fn reserve_epochs(&self, n: u64) -> FsResult<u64> {
        Ok(self.add_to_counter(EPOCHS, n)? + 1)
    }
}
