//! The set of datanode directories of a mount: which are alive (datanode
//! heartbeats, never lease renewal) and which are chosen for a new pipeline.

use std::path::PathBuf;
use std::time::Duration;

use crate::error::{FsError, FsResult};
use crate::storage::datanode::Datanode;
use crate::sync::{Arc, AtomicBool, AtomicU64, Ordering};

pub struct Datanodes {
    nodes: Vec<Arc<Datanode>>,
    alive: Vec<AtomicBool>,
    free: Vec<AtomicU64>,
    next: AtomicU64,
    pub replication: usize,
    /// Test-only fault: a datanode that sleeps before every packet.
    slow: Option<(usize, Duration)>,
}

impl Datanodes {
    pub fn open(
        dirs: &[PathBuf],
        replication: usize,
        slow: Option<(usize, Duration)>,
    ) -> FsResult<Datanodes> {
        let mut nodes = Vec::new();
        for (i, d) in dirs.iter().enumerate() {
            nodes.push(Arc::new(Datanode::open(i, d)?));
        }
        let n = nodes.len();
        Ok(Datanodes {
            nodes,
            alive: (0..n).map(|_| AtomicBool::new(true)).collect(),
            free: (0..n).map(|_| AtomicU64::new(u64::MAX)).collect(),
            next: AtomicU64::new(0),
            replication,
            slow,
        })
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    pub fn get(&self, i: usize) -> Option<&Arc<Datanode>> {
        self.nodes.get(i)
    }

    pub fn is_alive(&self, i: usize) -> bool {
        self.alive.get(i).is_some_and(|a| a.load(Ordering::Relaxed))
    }

    /// Marks a datanode dead until its next good heartbeat.
    pub fn mark_dead(&self, i: usize) {
        if let Some(a) = self.alive.get(i)
            && a.swap(false, Ordering::Relaxed)
        {
            tracing::warn!(
                datanode = i,
                "datanode marked dead; excluded from new pipelines"
            );
        }
    }

    /// One round of datanode heartbeats: each directory must take a small
    /// synced write; the free space is remembered for placement.
    pub fn heartbeat(&self) {
        for (i, dn) in self.nodes.iter().enumerate() {
            match dn.heartbeat() {
                Ok(free) => {
                    self.free[i].store(free, Ordering::Relaxed);
                    if !self.alive[i].swap(true, Ordering::Relaxed) {
                        tracing::info!(datanode = i, "datanode healthy again; rejoins pipelines");
                    }
                }
                Err(e) => {
                    if self.alive[i].swap(false, Ordering::Relaxed) {
                        tracing::warn!(datanode = i, error = %e, "datanode heartbeat failed");
                    }
                }
            }
        }
    }

    /// Chooses up to `n` distinct live datanodes not in `exclude`, rotating
    /// the starting point so that blocks spread over all of them.
    pub fn choose(&self, n: usize, exclude: &[usize]) -> Vec<usize> {
        let len = self.nodes.len();
        if len == 0 {
            return Vec::new();
        }
        let start = self.next.fetch_add(1, Ordering::Relaxed) as usize;
        (0..len)
            .map(|k| (start + k) % len)
            .filter(|i| self.is_alive(*i) && !exclude.contains(i))
            .take(n)
            .collect()
    }

    /// Chooses a full pipeline for a new block, failing when no datanode
    /// is alive.
    pub fn choose_pipeline(&self) -> FsResult<Vec<usize>> {
        let v = self.choose(self.replication, &[]);
        if v.is_empty() {
            return Err(FsError::Io("no live datanode for a new block".into()));
        }
        Ok(v)
    }

    pub fn fault_delay(&self, i: usize) {
        if let Some((dn, d)) = self.slow
            && dn == i
        {
            std::thread::sleep(d);
        }
    }

    /// Deletes every replica of `blocks` (files removed or truncated away);
    /// a failure leaves an orphan that housekeeping removes later.
    pub fn delete_blocks(&self, blocks: &[crate::meta::BlockRow]) {
        for b in blocks {
            for &dn in &b.replicas {
                if let Some(node) = self.get(dn)
                    && let Err(e) = node.delete_recorded(b.block_id, b.gs)
                {
                    tracing::warn!(datanode = dn, "replica delete failed: {e}");
                }
            }
        }
    }

    pub fn free_bytes(&self) -> u64 {
        self.free
            .iter()
            .map(|f| f.load(Ordering::Relaxed))
            .filter(|f| *f != u64::MAX)
            .min()
            .unwrap_or(0)
    }
}
