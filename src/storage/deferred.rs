//! Replicas held in memory until they are needed on disk.
//!
//! Why. A small file's fsync made durable by the block journal (see
//! `pipeline::journal`) has its bytes in the metadata store's WAL; its
//! replica files only have to exist before the journal's checkpoint
//! syncs them and forgets the row. Creating two files per replica on the
//! fsync's path costs more than the WAL's `fdatasync` (benches/PROFILE.md,
//! "seventh look"), so the datanode keeps such a replica here and writes
//! it when anything first needs it on disk: the checkpoint's sync, a
//! read, a lookup or listing, a change, a copy. A crash loses only what
//! the journal's replay at the next mount rewrites from the rows.
//!
//! Bounded in bytes ([`MAX_BYTES`] per datanode): past it a replica is
//! written at once, as without the journal.

use std::collections::HashMap;

use super::error::StorageError;
use crate::sync::{Arc, AtomicUsize, Mutex, Ordering, lock};

/// What one datanode keeps in memory at most.
pub const MAX_BYTES: usize = 16 << 20;

/// A replica not yet written: its stamp, bytes and chunk CRCs.
#[derive(Debug)]
struct Held {
    gs: u64,
    data: Vec<u8>,
    crcs: Vec<u32>,
    /// Taken while it is written, and true once it is: a second call on
    /// the block waits for the first rather than write it again.
    written: Mutex<bool>,
}

/// The replicas of one datanode held in memory.
#[derive(Debug, Default)]
pub struct Deferred {
    /// Never held across I/O: an fsync adding a replica does not wait
    /// for the checkpoint writing others.
    held: Mutex<HashMap<u64, Arc<Held>>>,
    /// Entries in `held`: the fast path of every call on a block is one
    /// load when nothing is held.
    count: AtomicUsize,
    bytes: AtomicUsize,
}

impl Deferred {
    /// Keeps replica `block`@`gs`; false (nothing kept) past the bound.
    pub fn hold(&self, block: u64, gs: u64, data: &[u8], crcs: &[u32]) -> bool {
        let entry = Arc::new(Held {
            gs,
            data: data.to_vec(),
            crcs: crcs.to_vec(),
            written: Mutex::new(false),
        });
        let mut held = lock(&self.held);
        if self.bytes.load(Ordering::Relaxed) + data.len() > MAX_BYTES {
            return false;
        }
        self.bytes.fetch_add(data.len(), Ordering::Relaxed);
        if let Some(old) = held.insert(block, entry) {
            self.bytes.fetch_sub(old.data.len(), Ordering::Relaxed);
        } else {
            self.count.fetch_add(1, Ordering::Release);
        }
        true
    }

    /// Whether `block` is held (for tests and fault injection).
    #[cfg(test)]
    pub fn holds(&self, block: u64) -> bool {
        self.get(block).is_some()
    }

    fn get(&self, block: u64) -> Option<Arc<Held>> {
        if self.count.load(Ordering::Acquire) == 0 {
            return None;
        }
        lock(&self.held).get(&block).cloned()
    }

    /// Writes `block` out through `write` if it is held. On failure the
    /// replica stays held (its bytes are durable in the journal; a later
    /// call may succeed, and the next mount's replay rewrites it).
    pub fn write_out(
        &self,
        block: u64,
        write: impl FnOnce(u64, &[u8], &[u32]) -> Result<(), StorageError>,
    ) -> Result<(), StorageError> {
        let Some(h) = self.get(block) else {
            return Ok(());
        };
        let mut written = lock(&h.written);
        if !*written {
            write(h.gs, &h.data, &h.crcs)?;
            *written = true;
        }
        drop(written);
        self.remove(block, &h);
        Ok(())
    }

    /// Writes out every held replica; the first error, after trying all.
    pub fn write_all(
        &self,
        mut write: impl FnMut(u64, u64, &[u8], &[u32]) -> Result<(), StorageError>,
    ) -> Result<(), StorageError> {
        if self.count.load(Ordering::Acquire) == 0 {
            return Ok(());
        }
        let blocks: Vec<u64> = lock(&self.held).keys().copied().collect();
        let mut first = Ok(());
        for block in blocks {
            let r = self.write_out(block, |gs, data, crcs| write(block, gs, data, crcs));
            if first.is_ok() {
                first = r;
            }
        }
        first
    }

    /// Drops `block` unwritten (its replica is being deleted).
    pub fn forget(&self, block: u64) {
        if let Some(h) = self.get(block) {
            // Not while it is being written (the delete comes after),
            // and never after: a write-out that got the entry first finds
            // it done.
            *lock(&h.written) = true;
            self.remove(block, &h);
        }
    }

    /// Drops everything held, unwritten: what a crash does.
    #[cfg(test)]
    pub fn lose(&self) {
        let blocks: Vec<u64> = lock(&self.held).keys().copied().collect();
        for block in blocks {
            self.forget(block);
        }
    }

    /// Removes `block`'s entry if it is still `h` (not replaced since).
    fn remove(&self, block: u64, h: &Arc<Held>) {
        let mut held = lock(&self.held);
        if held.get(&block).is_some_and(|e| Arc::ptr_eq(e, h)) {
            held.remove(&block);
            self.bytes.fetch_sub(h.data.len(), Ordering::Relaxed);
            self.count.fetch_sub(1, Ordering::Release);
        }
    }
}
