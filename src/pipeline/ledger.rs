//! [`SyncLedger`]: what this daemon knows of its replicas' durability, so
//! that an fsync syncs only what is not known durable, and never takes a
//! replica whose sync once failed for a durable one.
//!
//! A finalized replica is named by its block, generation stamp, length
//! and datanode: whatever changes its bytes (an append, a truncation,
//! recovery) gives the block a new stamp, and a copy onto another
//! datanode is another replica. So a replica an fsync made durable stays
//! durable under that name, whoever changes the file afterwards (a close
//! on this daemon, a writer on another one): the next fsync finds new
//! names for whatever changed, and syncs them. Replicas of blocks not
//! finalized (being written, or left open) are never taken as durable.

use std::collections::{HashMap, HashSet};

use crate::meta::{BlockRow, DnId};
use crate::sync::{Mutex, lock};

/// Files remembered at most; past it the ledger starts again (every file
/// is then synced in full once more), so its memory stays bounded.
const MAX_FILES: usize = 1 << 16;

/// One replica of one block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Replica {
    pub block: u64,
    pub dn: DnId,
}

/// A finalized replica as an fsync made it durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Durable {
    block: u64,
    gs: u64,
    len: u64,
    dn: DnId,
}

#[derive(Default)]
struct Inner {
    /// Per file, its finalized replicas made durable by an fsync since
    /// the daemon started.
    files: HashMap<u64, HashSet<Durable>>,
    /// Replicas whose sync failed while their block kept no replica that
    /// synced (so they stay in its list): no later sync of them counts,
    /// since the kernel reports a writeback error once and may have
    /// dropped the bytes.
    failed: HashSet<Replica>,
}

#[derive(Default)]
pub struct SyncLedger {
    inner: Mutex<Inner>,
}

impl SyncLedger {
    /// The replicas of `rows` (some of file `ino`'s blocks) that an fsync
    /// must sync: all but those known durable.
    pub(crate) fn to_sync(&self, ino: u64, rows: &[BlockRow]) -> Vec<Replica> {
        let g = lock(&self.inner);
        let known = g.files.get(&ino);
        rows.iter()
            .flat_map(|r| r.replicas.iter().map(move |&dn| (r, dn)))
            .filter(|(r, dn)| !(r.finalized && known.is_some_and(|k| k.contains(&key(r, *dn)))))
            .map(|(r, dn)| Replica {
                block: r.block_id,
                dn,
            })
            .collect()
    }

    /// An fsync of file `ino` made the replicas `rows` list durable (the
    /// rows as recorded after the fsync: a replica that failed has left
    /// them, or the fsync failed).
    pub(crate) fn synced(&self, ino: u64, rows: &[BlockRow]) {
        let mut g = lock(&self.inner);
        if g.files.len() >= MAX_FILES && !g.files.contains_key(&ino) {
            g.files.clear();
        }
        let known = g.files.entry(ino).or_default();
        let blocks: HashSet<u64> = rows.iter().map(|r| r.block_id).collect();
        known.retain(|d| !blocks.contains(&d.block));
        for r in rows.iter().filter(|r| r.finalized) {
            known.extend(r.replicas.iter().map(|&dn| key(r, dn)));
        }
    }

    /// Forgets file `ino` (deleted, or recovered).
    pub fn forget(&self, ino: u64) {
        lock(&self.inner).files.remove(&ino);
    }

    /// Whether a sync of `r` failed and it is still its block's replica.
    pub(crate) fn has_failed(&self, r: &Replica) -> bool {
        lock(&self.inner).failed.contains(r)
    }

    /// Replicas whose sync failed in a block that keeps no replica that
    /// synced: they stay in its list, never again taken for durable.
    pub(crate) fn failed(&self, replicas: impl IntoIterator<Item = Replica>) {
        lock(&self.inner).failed.extend(replicas);
    }

    /// `r` left its block's list: whatever it was, it is no replica now.
    pub(crate) fn left(&self, r: &Replica) {
        lock(&self.inner).failed.remove(r);
    }
}

fn key(r: &BlockRow, dn: DnId) -> Durable {
    Durable {
        block: r.block_id,
        gs: r.gs,
        len: r.len,
        dn,
    }
}
