//! The datanodes of a mount: every datanode the filesystem has recorded
//! and not removed, by registry id (those not attached in this mount are
//! dead), how each one is doing (datanode heartbeats and pipeline
//! failures, never lease renewal: live, full or dead), what the operator
//! made of it (in service, decommissioning, decommissioned), and which are
//! chosen for a new replica. The set changes while the daemon runs:
//! `leasefs datanode add` and `remove`, and over etcd other daemons'
//! changes of the registry (see [`Datanodes::reconcile`]).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::fs_sync::FsSyncs;
use super::in_flight::{Hold, InFlight};
use super::placement::{self, Candidate};
use crate::error::{FsError, FsResult};
use crate::meta::{AdminState, DatanodeRecord, DnId};
use crate::storage::{Storage, StorageError};
use crate::sync::{Arc, AtomicU8, AtomicU64, Ordering, RwLock};

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

    pub fn as_str(self) -> &'static str {
        match self {
            Health::Live => "live",
            Health::Full => "full",
            Health::Dead => "dead",
        }
    }
}

fn admin_from_u8(v: u8) -> AdminState {
    match v {
        0 => AdminState::Normal,
        1 => AdminState::Decommissioning,
        2 => AdminState::Decommissioned,
        3 => AdminState::Upgrading,
        _ => AdminState::Removed,
    }
}

fn admin_to_u8(a: AdminState) -> u8 {
    match a {
        AdminState::Normal => 0,
        AdminState::Decommissioning => 1,
        AdminState::Decommissioned => 2,
        AdminState::Upgrading => 3,
        AdminState::Removed => 4,
    }
}

fn normal() -> AdminState {
    AdminState::Normal
}

/// One datanode's line in `fsck` and `datanode list`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DatanodeStatus {
    pub id: DnId,
    pub storage_id: Option<String>,
    pub path: PathBuf,
    pub state: Health,
    /// What the operator made of it (normal, decommissioning, ...).
    #[serde(default = "normal")]
    pub admin: AdminState,
    /// Free bytes on its filesystem at its last heartbeat (attached only).
    #[serde(default)]
    pub free_bytes: Option<u64>,
    /// When its last good heartbeat ran (wall clock, ms since the epoch).
    #[serde(default)]
    pub last_heartbeat_ms: Option<u64>,
    /// Why it is dead, when it is.
    pub detail: Option<String>,
}

impl DatanodeStatus {
    /// The state an operator sees (`datanode list`, `stats`): dead wins,
    /// then what the operator made of it, then live or full.
    pub fn state_name(&self) -> &'static str {
        match (self.state, self.admin) {
            (Health::Dead, _) => "dead",
            (_, AdminState::Decommissioning) => "decommissioning",
            (_, AdminState::Decommissioned) => "decommissioned",
            (h, _) => h.as_str(),
        }
    }
}

/// A recorded datanode, attached in this mount or not.
#[derive(Debug)]
struct Slot {
    id: DnId,
    storage_id: Option<String>,
    path: PathBuf,
    node: Option<Arc<dyn Storage>>,
    health: AtomicU8,
    admin: AtomicU8,
    free: AtomicU64,
    /// Wall-clock ms of its last good heartbeat (0: none yet).
    beat_ms: AtomicU64,
    /// Why a datanode that is not attached is not.
    absent: Option<String>,
}

impl Slot {
    fn attached(a: Attached) -> Slot {
        let Attached { node, admin } = a;
        Slot {
            id: node.id(),
            storage_id: node.storage_id().map(str::to_string),
            path: node.root().to_path_buf(),
            node: Some(node),
            health: AtomicU8::new(Health::Live as u8),
            admin: AtomicU8::new(admin_to_u8(admin)),
            free: AtomicU64::new(u64::MAX),
            beat_ms: AtomicU64::new(0),
            absent: None,
        }
    }

    fn absent(a: Absent) -> Slot {
        Slot {
            id: a.record.id,
            storage_id: a.record.storage_id,
            path: a.record.path,
            node: None,
            health: AtomicU8::new(Health::Dead as u8),
            admin: AtomicU8::new(admin_to_u8(a.record.state)),
            free: AtomicU64::new(0),
            beat_ms: AtomicU64::new(0),
            absent: Some(a.why),
        }
    }

    fn health(&self) -> Health {
        Health::from_u8(self.health.load(Ordering::Relaxed))
    }

    fn admin(&self) -> AdminState {
        admin_from_u8(self.admin.load(Ordering::Relaxed))
    }
}

/// A datanode attached in this mount, and what the operator made of it.
pub struct Attached {
    pub node: Arc<dyn Storage>,
    pub admin: AdminState,
}

/// A recorded datanode this mount could not attach, and why.
pub struct Absent {
    pub record: DatanodeRecord,
    pub why: String,
}

type Slots = Arc<Vec<Arc<Slot>>>;

#[derive(Debug)]
pub struct Datanodes {
    /// Sorted by id; replaced whole when a datanode is added or removed,
    /// so readers take a snapshot and never wait for a change.
    slots: RwLock<Slots>,
    pub replication: usize,
    /// Blocks this daemon is writing or copying but has not recorded yet.
    in_flight: Arc<InFlight>,
    /// Each datanode filesystem's grouped `syncfs`.
    pub fs_syncs: FsSyncs,
}

impl Datanodes {
    /// The attached datanodes `nodes` and the recorded ones that are not.
    pub fn new(nodes: Vec<Attached>, absent: Vec<Absent>, replication: usize) -> Datanodes {
        let mut slots: Vec<Arc<Slot>> = nodes
            .into_iter()
            .map(|a| Arc::new(Slot::attached(a)))
            .collect();
        slots.extend(absent.into_iter().map(|a| Arc::new(Slot::absent(a))));
        slots.sort_by_key(|s| s.id);
        Datanodes {
            slots: RwLock::new(Arc::new(slots)),
            replication,
            in_flight: Arc::default(),
            fs_syncs: FsSyncs::default(),
        }
    }

    /// Datanodes at `dirs` with ids 0, 1, ... in that order and no
    /// identity files.
    #[cfg(test)]
    pub fn unregistered(dirs: &[PathBuf], replication: usize) -> FsResult<Datanodes> {
        let mut nodes = Vec::new();
        for (i, d) in dirs.iter().enumerate() {
            let node = crate::storage::Datanode::open(DnId(i as u32), d, None)?;
            nodes.push(Attached {
                node: Arc::new(node),
                admin: AdminState::Normal,
            });
        }
        Ok(Datanodes::new(nodes, Vec::new(), replication))
    }

    /// The given datanodes (e.g. faulty ones), all in service.
    #[cfg(test)]
    pub fn of(nodes: Vec<Arc<dyn Storage>>, replication: usize) -> Datanodes {
        let nodes = nodes
            .into_iter()
            .map(|node| Attached {
                node,
                admin: AdminState::Normal,
            })
            .collect();
        Datanodes::new(nodes, Vec::new(), replication)
    }

    /// Registers `block` as being written or copied, before its first
    /// replica file is created, until the hold is dropped after the commit
    /// that records it (see [`super::in_flight`]).
    pub fn hold(&self, block: u64) -> Hold {
        self.in_flight.hold(block)
    }

    /// Whether this daemon is writing or copying `block` and may not have
    /// recorded it yet: no sweep deletes its replica files.
    pub fn in_flight(&self, block: u64) -> bool {
        self.in_flight.contains(block)
    }

    fn snapshot(&self) -> Slots {
        self.slots.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn slot(&self, id: DnId) -> Option<Arc<Slot>> {
        let slots = self.snapshot();
        slots
            .binary_search_by_key(&id, |s| s.id)
            .ok()
            .map(|i| slots[i].clone())
    }

    /// Replaces the slot list with `f` of it (one change at a time).
    fn change(&self, f: impl FnOnce(&mut Vec<Arc<Slot>>)) {
        let mut g = self.slots.write().unwrap_or_else(|e| e.into_inner());
        let mut v: Vec<Arc<Slot>> = g.as_ref().clone();
        f(&mut v);
        v.sort_by_key(|s| s.id);
        *g = Arc::new(v);
    }

    /// How many datanodes the filesystem has recorded (attached or not,
    /// removed ones aside).
    pub fn len(&self) -> usize {
        self.snapshot().len()
    }

    pub fn is_empty(&self) -> bool {
        self.snapshot().is_empty()
    }

    /// The datanodes attached in this mount.
    pub fn attached(&self) -> Vec<Arc<dyn Storage>> {
        self.snapshot()
            .iter()
            .filter_map(|s| s.node.clone())
            .collect()
    }

    /// Datanode `id`, if it is attached in this mount.
    pub fn get(&self, id: DnId) -> Option<Arc<dyn Storage>> {
        self.slot(id).and_then(|s| s.node.clone())
    }

    /// Whether the filesystem records datanode `id` (attached or not). A
    /// replica on a datanode it does not record (one removed by the
    /// operator) is gone for good, not merely out of reach.
    pub fn is_recorded(&self, id: DnId) -> bool {
        self.slot(id).is_some()
    }

    pub fn health(&self, id: DnId) -> Health {
        self.slot(id).map_or(Health::Dead, |s| s.health())
    }

    /// The operator's state of datanode `id` (`Removed` if not recorded).
    pub fn admin(&self, id: DnId) -> AdminState {
        self.slot(id).map_or(AdminState::Removed, |s| s.admin())
    }

    /// Live or full: its replicas can be read (also while it is being
    /// decommissioned, or decommissioned and not yet removed).
    pub fn is_alive(&self, id: DnId) -> bool {
        self.health(id) != Health::Dead
    }

    /// Alive and in service: its replicas count toward the replication
    /// factor.
    pub fn counts(&self, id: DnId) -> bool {
        self.slot(id)
            .is_some_and(|s| s.health() != Health::Dead && s.admin().in_service())
    }

    /// Records the operator's state of datanode `id` in this daemon's view.
    pub fn set_admin(&self, id: DnId, a: AdminState) {
        if let Some(s) = self.slot(id) {
            let was = admin_from_u8(s.admin.swap(admin_to_u8(a), Ordering::Relaxed));
            if was != a {
                tracing::info!(datanode = %id, was = was.as_str(), now = a.as_str(), "datanode admin state changed");
            }
        }
    }

    /// Attaches `node` while the daemon runs (`datanode add`, or a
    /// datanode another daemon added): it replaces the slot of the same
    /// id, if the datanode was recorded but absent. Its first heartbeat
    /// runs here, so placement knows its free space at once.
    pub fn insert(&self, node: Arc<dyn Storage>, admin: AdminState) {
        let id = node.id();
        let slot = Arc::new(Slot::attached(Attached { node, admin }));
        self.beat(&slot);
        self.change(|v| {
            v.retain(|s| s.id != id);
            v.push(slot);
        });
    }

    /// Records a datanode another daemon registered that this one cannot
    /// attach (dead here).
    pub fn insert_absent(&self, a: Absent) {
        let id = a.record.id;
        self.change(|v| {
            if !v.iter().any(|s| s.id == id) {
                v.push(Arc::new(Slot::absent(a)));
            }
        });
    }

    /// Forgets datanode `id` (removed): it leaves every pipeline before
    /// its next packet and its replicas are gone for this daemon.
    pub fn remove(&self, id: DnId) {
        self.change(|v| v.retain(|s| s.id != id));
    }

    /// Brings this daemon's view in line with the registry `records`:
    /// admin states, removed datanodes, and datanodes registered since
    /// (by another daemon), which `open` tries to attach at their recorded
    /// path (`Err(why)`: dead here). Datanodes recorded at mount but left
    /// out of this daemon's list stay out.
    pub fn reconcile(
        &self,
        records: &[DatanodeRecord],
        open: impl Fn(&DatanodeRecord) -> Result<Arc<dyn Storage>, String>,
    ) {
        for r in records {
            match (self.slot(r.id), r.state) {
                (Some(_), AdminState::Removed) => {
                    tracing::warn!(datanode = %r.id, path = %r.path.display(), "datanode removed from the filesystem");
                    self.remove(r.id)
                }
                (None, AdminState::Removed) => {}
                (Some(_), a) => self.set_admin(r.id, a),
                (None, a) => match open(r) {
                    Ok(node) => {
                        tracing::info!(datanode = %r.id, path = %r.path.display(), "datanode added by another daemon attached");
                        self.insert(node, a)
                    }
                    Err(why) => {
                        tracing::warn!(datanode = %r.id, path = %r.path.display(), "datanode added by another daemon cannot be attached here: {why}");
                        self.insert_absent(Absent {
                            record: r.clone(),
                            why,
                        })
                    }
                },
            }
        }
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
        for s in self.snapshot().iter() {
            self.beat(s);
        }
    }

    fn beat(&self, s: &Slot) {
        let Some(dn) = &s.node else { return };
        match dn.heartbeat() {
            Ok(free) => {
                s.free.store(free, Ordering::Relaxed);
                s.beat_ms.store(crate::clock::wall_ms(), Ordering::Relaxed);
                let h = if free < FULL_BELOW {
                    Health::Full
                } else {
                    Health::Live
                };
                self.set_health(s.id, h, &"heartbeat");
            }
            Err(e @ StorageError::NoSpace { .. }) => {
                s.free.store(0, Ordering::Relaxed);
                s.beat_ms.store(crate::clock::wall_ms(), Ordering::Relaxed);
                self.set_health(s.id, Health::Full, &e);
            }
            Err(e) => {
                if s.health() != Health::Dead {
                    tracing::warn!(datanode = %s.id, error = %e, "datanode heartbeat failed");
                }
                self.set_health(s.id, Health::Dead, &e);
            }
        }
    }

    /// Free bytes of datanode `id` at its last heartbeat.
    pub fn free(&self, id: DnId) -> Option<u64> {
        self.slot(id)
            .filter(|s| s.node.is_some())
            .map(|s| s.free.load(Ordering::Relaxed))
    }

    /// Chooses up to `n` distinct live, in-service datanodes not in
    /// `exclude` with at least `room` bytes free (as of their last
    /// heartbeat), weighted by free space (see [`placement`]).
    pub fn choose_with_room(&self, n: usize, exclude: &[DnId], room: u64) -> Vec<DnId> {
        let cands = self
            .snapshot()
            .iter()
            .filter(|s| {
                s.node.is_some()
                    && s.health() == Health::Live
                    && s.admin().in_service()
                    && s.free.load(Ordering::Relaxed) >= room
                    && !exclude.contains(&s.id)
            })
            .map(|s| Candidate {
                id: s.id,
                free: s.free.load(Ordering::Relaxed),
            })
            .collect();
        placement::pick_random(cands, n)
    }

    /// [`Self::choose_with_room`] for a new replica of any size.
    pub fn choose(&self, n: usize, exclude: &[DnId]) -> Vec<DnId> {
        self.choose_with_room(n, exclude, 0)
    }

    /// The most a file may grow by at once through a truncation: the
    /// free space (as of the last heartbeats, unprivileged: root's reserved
    /// blocks not counted) of the R-th roomiest live datanode in service,
    /// less [`FULL_BELOW`]. Growth is sparse (holes and their checksums,
    /// about 0.8% of it), but a replica copied by a repair, a spare or the
    /// balancer is written out in full, so no file grows past what R
    /// datanodes could hold.
    pub fn growth_room(&self) -> u64 {
        let mut free: Vec<u64> = self
            .snapshot()
            .iter()
            .filter(|s| s.node.is_some() && s.health() == Health::Live && s.admin().in_service())
            .map(|s| s.free.load(Ordering::Relaxed))
            .collect();
        free.sort_unstable_by(|a, b| b.cmp(a));
        let k = self.replication.min(free.len());
        match k.checked_sub(1).and_then(|i| free.get(i)) {
            Some(f) => f.saturating_sub(FULL_BELOW),
            None => 0,
        }
    }

    /// Chooses a full pipeline for a new block, failing when no datanode
    /// can take it (with `ENOSPC` when those left in service are full).
    pub fn choose_pipeline(&self) -> FsResult<Vec<DnId>> {
        let v = self.choose(self.replication, &[]);
        if !v.is_empty() {
            return Ok(v);
        }
        if self
            .snapshot()
            .iter()
            .any(|s| s.health() == Health::Full && s.admin().in_service())
        {
            return Err(FsError::NoSpace);
        }
        Err(FsError::Io(
            "no live datanode in service for a new block".into(),
        ))
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
        self.snapshot()
            .iter()
            .map(|s| {
                let state = s.health();
                DatanodeStatus {
                    id: s.id,
                    storage_id: s.storage_id.clone(),
                    path: s.path.clone(),
                    state,
                    admin: s.admin(),
                    free_bytes: s
                        .node
                        .as_ref()
                        .map(|_| s.free.load(Ordering::Relaxed))
                        .filter(|f| *f != u64::MAX),
                    last_heartbeat_ms: Some(s.beat_ms.load(Ordering::Relaxed)).filter(|t| *t > 0),
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
        let node = crate::storage::Datanode::open(DnId(3), &dir.path().join("a"), None).unwrap();
        let absent = Absent {
            record: DatanodeRecord {
                id: DnId(1),
                storage_id: Some("DS-x".into()),
                path: dir.path().join("gone"),
                state: AdminState::Normal,
            },
            why: "not in the --datanode list".into(),
        };
        let node = Attached {
            node: Arc::new(node),
            admin: AdminState::Normal,
        };
        let dns = Datanodes::new(vec![node], vec![absent], 1);
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
