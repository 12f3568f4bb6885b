//! The datanodes of a mount: every datanode the filesystem has recorded,
//! by registry id (those not attached in this mount are dead), how each
//! one is doing (datanode heartbeats and pipeline failures, never lease
//! renewal: live, full or dead), and which are chosen for a new pipeline.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{FsError, FsResult};
use crate::meta::{DatanodeRecord, DnId};
use crate::storage::datanode::{Datanode, StorageError};
use crate::sync::{Arc, AtomicU8, AtomicU64, Ordering};

/// A datanode with less free space than this is full: it serves reads but
/// takes no new replica (HDFS leaves such a datanode out of placement too).
pub const FULL_BELOW: u64 = 1 << 20;

/// How a datanode is doing, as its heartbeats and writes say.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Health {
    /// Answers heartbeats and has room: reads and new replicas.
    Live,
    /// Answers heartbeats but has no room: reads only.
    Full,
    /// Failed its heartbeat, or is recorded but not attached: nothing.
    Dead,
}

impl Health {
    fn from_u8(v: u8) -> Health {
        match v {
            0 => Health::Live,
            1 => Health::Full,
            _ => Health::Dead,
        }
    }
}

/// One datanode's line in `fsck`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DatanodeStatus {
    pub id: DnId,
    pub storage_id: Option<String>,
    pub path: PathBuf,
    pub state: Health,
    /// Why it is dead, when it is.
    pub detail: Option<String>,
}

/// A recorded datanode, attached in this mount or not.
#[derive(Debug)]
struct Slot {
    id: DnId,
    storage_id: Option<String>,
    path: PathBuf,
    node: Option<Arc<Datanode>>,
    health: AtomicU8,
    free: AtomicU64,
    /// Why a datanode that is not attached is not.
    absent: Option<String>,
}

/// A recorded datanode this mount could not attach, and why.
pub struct Absent {
    pub record: DatanodeRecord,
    pub why: String,
}

#[derive(Debug)]
pub struct Datanodes {
    /// Sorted by id.
    slots: Vec<Slot>,
    next: AtomicU64,
    pub replication: usize,
    /// Test-only fault: a datanode that sleeps before every packet.
    slow: Option<(DnId, Duration)>,
}

impl Datanodes {
    /// The attached datanodes `nodes` and the recorded ones that are not.
    pub fn new(
        nodes: Vec<Datanode>,
        absent: Vec<Absent>,
        replication: usize,
        slow: Option<(DnId, Duration)>,
    ) -> Datanodes {
        let mut slots: Vec<Slot> = nodes
            .into_iter()
            .map(|n| Slot {
                id: n.id,
                storage_id: n.storage_id().map(str::to_string),
                path: n.root.clone(),
                node: Some(Arc::new(n)),
                health: AtomicU8::new(Health::Live as u8),
                free: AtomicU64::new(u64::MAX),
                absent: None,
            })
            .collect();
        slots.extend(absent.into_iter().map(|a| Slot {
            id: a.record.id,
            storage_id: a.record.storage_id,
            path: a.record.path,
            node: None,
            health: AtomicU8::new(Health::Dead as u8),
            free: AtomicU64::new(0),
            absent: Some(a.why),
        }));
        slots.sort_by_key(|s| s.id);
        Datanodes {
            slots,
            next: AtomicU64::new(0),
            replication,
            slow,
        }
    }

    /// Datanodes at `dirs` with ids 0, 1, ... in that order and no
    /// identity files.
    #[cfg(test)]
    pub fn unregistered(dirs: &[PathBuf], replication: usize) -> FsResult<Datanodes> {
        let mut nodes = Vec::new();
        for (i, d) in dirs.iter().enumerate() {
            nodes.push(Datanode::open(DnId(i as u32), d, None)?);
        }
        Ok(Datanodes::new(nodes, Vec::new(), replication, None))
    }

    fn slot(&self, id: DnId) -> Option<&Slot> {
        self.slots
            .binary_search_by_key(&id, |s| s.id)
            .ok()
            .map(|i| &self.slots[i])
    }

    /// How many datanodes the filesystem has recorded (attached or not).
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The datanodes attached in this mount.
    pub fn attached(&self) -> impl Iterator<Item = &Arc<Datanode>> {
        self.slots.iter().filter_map(|s| s.node.as_ref())
    }

    /// Datanode `id`, if it is attached in this mount.
    pub fn get(&self, id: DnId) -> Option<&Arc<Datanode>> {
        self.slot(id).and_then(|s| s.node.as_ref())
    }

    pub fn health(&self, id: DnId) -> Health {
        self.slot(id).map_or(Health::Dead, |s| {
            Health::from_u8(s.health.load(Ordering::Relaxed))
        })
    }

    /// Live or full: its replicas can be read.
    pub fn is_alive(&self, id: DnId) -> bool {
        self.health(id) != Health::Dead
    }

    fn set_health(&self, id: DnId, h: Health, why: &dyn std::fmt::Display) {
        let Some(s) = self.slot(id).filter(|s| s.node.is_some()) else {
            return;
        };
        let was = Health::from_u8(s.health.swap(h as u8, Ordering::Relaxed));
        match (was, h) {
            (a, b) if a == b => {}
            (_, Health::Dead) => tracing::warn!(
                datanode = %id,
                error = %why,
                "datanode marked dead; excluded from new pipelines"
            ),
            (_, Health::Full) => tracing::warn!(
                datanode = %id,
                "datanode full; serves reads, excluded from new pipelines"
            ),
            (_, Health::Live) => {
                tracing::info!(datanode = %id, "datanode healthy again; rejoins pipelines")
            }
        }
    }

    /// Marks a datanode dead until its next good heartbeat.
    pub fn mark_dead(&self, id: DnId) {
        self.set_health(id, Health::Dead, &"failed an operation");
    }

    /// A replica operation on `id` failed with `e`: a full disk makes the
    /// datanode full (it still serves reads), anything else dead, until its
    /// next heartbeat.
    pub fn mark_failed(&self, id: DnId, e: &StorageError) {
        match e {
            StorageError::NoSpace { .. } => {
                if let Some(s) = self.slot(id) {
                    s.free.store(0, Ordering::Relaxed);
                }
                self.set_health(id, Health::Full, e)
            }
            _ => self.set_health(id, Health::Dead, e),
        }
    }

    /// One round of datanode heartbeats: each attached directory must still
    /// hold its identity file and take a small synced write; its free space
    /// is remembered for placement. A disk too full for the probe is full,
    /// not dead.
    pub fn heartbeat(&self) {
        for s in &self.slots {
            let Some(dn) = &s.node else { continue };
            match dn.heartbeat() {
                Ok(free) => {
                    s.free.store(free, Ordering::Relaxed);
                    let h = if free < FULL_BELOW {
                        Health::Full
                    } else {
                        Health::Live
                    };
                    self.set_health(s.id, h, &"heartbeat");
                }
                Err(e @ StorageError::NoSpace { .. }) => {
                    s.free.store(0, Ordering::Relaxed);
                    self.set_health(s.id, Health::Full, &e);
                }
                Err(e) => {
                    if self.is_alive(s.id) {
                        tracing::warn!(datanode = %s.id, error = %e, "datanode heartbeat failed");
                    }
                    self.set_health(s.id, Health::Dead, &e);
                }
            }
        }
    }

    /// Chooses up to `n` distinct live datanodes not in `exclude` with at
    /// least `room` bytes free (as of their last heartbeat), rotating the
    /// starting point so that blocks spread over all of them.
    pub fn choose_with_room(&self, n: usize, exclude: &[DnId], room: u64) -> Vec<DnId> {
        let len = self.slots.len();
        if len == 0 {
            return Vec::new();
        }
        let start = self.next.fetch_add(1, Ordering::Relaxed) as usize;
        (0..len)
            .map(|k| &self.slots[(start + k) % len])
            .filter(|s| {
                self.health(s.id) == Health::Live
                    && s.free.load(Ordering::Relaxed) >= room
                    && !exclude.contains(&s.id)
            })
            .map(|s| s.id)
            .take(n)
            .collect()
    }

    /// [`Self::choose_with_room`] for a new replica of any size.
    pub fn choose(&self, n: usize, exclude: &[DnId]) -> Vec<DnId> {
        self.choose_with_room(n, exclude, 0)
    }

    /// Chooses a full pipeline for a new block, failing when no datanode
    /// is live (with `ENOSPC` when those left are full).
    pub fn choose_pipeline(&self) -> FsResult<Vec<DnId>> {
        let v = self.choose(self.replication, &[]);
        if !v.is_empty() {
            return Ok(v);
        }
        if self.slots.iter().any(|s| self.health(s.id) == Health::Full) {
            return Err(FsError::NoSpace);
        }
        Err(FsError::Io("no live datanode for a new block".into()))
    }

    pub fn fault_delay(&self, id: DnId) {
        if let Some((dn, d)) = self.slow
            && dn == id
        {
            std::thread::sleep(d);
        }
    }

    /// Deletes every replica of `blocks` (files removed or truncated away);
    /// a failure leaves an orphan that housekeeping removes later, as does
    /// a dead datanode (its directory may now hold something else).
    pub fn delete_blocks(&self, blocks: &[crate::meta::BlockRow]) {
        for b in blocks {
            for &dn in &b.replicas {
                if let Some(node) = self.get(dn).filter(|_| self.is_alive(dn))
                    && let Err(e) = node.delete_recorded(b.block_id, b.gs)
                {
                    tracing::warn!(datanode = %dn, "replica delete failed: {e}");
                }
            }
        }
    }

    /// Every recorded datanode and how it is doing, by id.
    pub fn statuses(&self) -> Vec<DatanodeStatus> {
        self.slots
            .iter()
            .map(|s| {
                let state = self.health(s.id);
                DatanodeStatus {
                    id: s.id,
                    storage_id: s.storage_id.clone(),
                    path: s.path.clone(),
                    state,
                    detail: match (&s.absent, state) {
                        (Some(why), _) => Some(why.clone()),
                        (None, Health::Dead) => Some("failed its heartbeat".into()),
                        _ => None,
                    },
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::AdminState;

    fn set(n: usize) -> (tempfile::TempDir, Datanodes) {
        let dir = tempfile::tempdir().unwrap();
        let dirs: Vec<PathBuf> = (0..n).map(|i| dir.path().join(format!("dn{i}"))).collect();
        let dns = Datanodes::unregistered(&dirs, 2).unwrap();
        (dir, dns)
    }

    #[test]
    fn a_full_datanode_serves_reads_but_takes_no_new_replica() {
        let (_dir, dns) = set(3);
        dns.heartbeat();
        let nospace = StorageError::NoSpace { path: "/x".into() };
        dns.mark_failed(DnId(1), &nospace);
        assert_eq!(dns.health(DnId(1)), Health::Full);
        assert!(dns.is_alive(DnId(1)));
        for _ in 0..6 {
            assert!(!dns.choose(3, &[]).contains(&DnId(1)));
        }
        // Other failures make it dead; its next good heartbeat makes it
        // live again (this disk has room).
        dns.mark_failed(
            DnId(2),
            &StorageError::Io {
                path: "/x".into(),
                source: std::io::Error::other("boom"),
            },
        );
        assert_eq!(dns.health(DnId(2)), Health::Dead);
        dns.heartbeat();
        assert_eq!(dns.health(DnId(1)), Health::Live);
        assert_eq!(dns.health(DnId(2)), Health::Live);
    }

    #[test]
    fn only_full_datanodes_left_is_enospc_and_a_recorded_absent_one_is_dead() {
        let dir = tempfile::tempdir().unwrap();
        let node = Datanode::open(DnId(3), &dir.path().join("a"), None).unwrap();
        let absent = Absent {
            record: DatanodeRecord {
                id: DnId(1),
                storage_id: Some("DS-x".into()),
                path: dir.path().join("gone"),
                state: AdminState::Normal,
            },
            why: "not in the --datanode list".into(),
        };
        let dns = Datanodes::new(vec![node], vec![absent], 1, None);
        assert_eq!(dns.len(), 2);
        assert!(dns.get(DnId(1)).is_none());
        assert_eq!(dns.health(DnId(1)), Health::Dead);
        assert_eq!(dns.choose_pipeline().unwrap(), vec![DnId(3)]);
        dns.mark_failed(DnId(3), &StorageError::NoSpace { path: "/x".into() });
        assert!(matches!(dns.choose_pipeline(), Err(FsError::NoSpace)));
        let st = dns.statuses();
        assert_eq!(
            st.iter().map(|s| (s.id, s.state)).collect::<Vec<_>>(),
            vec![(DnId(1), Health::Dead), (DnId(3), Health::Full)]
        );
        assert_eq!(st[0].detail.as_deref(), Some("not in the --datanode list"));
    }
}
