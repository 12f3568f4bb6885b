//! The datanodes of a mount: every datanode the filesystem has recorded
//! and not removed, by registry id (those not attached in this mount are
//! dead), how each one is doing (datanode heartbeats and pipeline
//! failures, never lease renewal: live, full or dead), what the operator
//! made of it (in service, decommissioning, decommissioned), and which are
//! chosen for a new replica. The set changes while the daemon runs:
//! `leasefs datanode add` and `remove`, and over etcd other daemons'
//! changes of the registry (see [`Datanodes::reconcile`]). With host-local
//! copies ([`super::copies`]) it also knows which datanodes are shared
//! (counted toward the replication factor) and which hold a host's copies.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::copies::{HostCopies, Role};
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
    /// Holds another host's copies (`-o local_copy` there): never
    /// attached here, and nothing is expected of it here.
    Elsewhere,
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
            Health::Elsewhere => "elsewhere",
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
    /// The host whose copies it holds (`None`: shared, counted toward
    /// the replication factor).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
}

impl DatanodeStatus {
    /// The state an operator sees (`datanode list`, `stats`): dead wins,
    /// then what the operator made of it, then live or full.
    pub fn state_name(&self) -> &'static str {
        match (self.state, self.admin) {
            (Health::Elsewhere, _) => "elsewhere",
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
    /// The host whose copies it holds (`None`: shared).
    host: Option<String>,
}

impl Slot {
    fn attached(a: Attached) -> Slot {
        let Attached { node, admin, host } = a;
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
            host,
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
            host: a.record.host,
        }
    }

    fn health(&self) -> Health {
        Health::from_u8(self.health.load(Ordering::Relaxed))
    }

    fn admin(&self) -> AdminState {
        admin_from_u8(self.admin.load(Ordering::Relaxed))
    }
}

/// A datanode attached in this mount, what the operator made of it, and
/// the host whose copies it holds (`None`: shared).
pub struct Attached {
    pub node: Arc<dyn Storage>,
    pub admin: AdminState,
    pub host: Option<String>,
}

impl Attached {
    /// A shared datanode in service (tests, tools).
    pub fn shared(node: Arc<dyn Storage>) -> Attached {
        Attached {
            node,
            admin: AdminState::Normal,
            host: None,
        }
    }
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
    /// This host, and whether this mount's directories hold its copies.
    here: HostCopies,
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
            here: HostCopies::default(),
        }
    }

    /// The same datanodes seen from host `here` (its copies and other
    /// hosts'; see [`super::copies`]). Without it every datanode recorded
    /// with a host is another host's.
    pub fn on_host(mut self, here: HostCopies) -> Datanodes {
        self.here = here;
        self
    }

    /// This host, and whether this mount's directories hold its copies.
    pub fn host(&self) -> &HostCopies {
        &self.here
    }

    fn role_of(&self, s: &Slot) -> Role {
        self.here.role(s.host.as_deref())
    }

    /// What datanode `id` is to this daemon (`Shared` if not recorded).
    pub fn role(&self, id: DnId) -> Role {
        self.slot(id).map_or(Role::Shared, |s| self.role_of(&s))
    }

    /// Whether datanode `id` holds a host's copies (this host's or
    /// another's): its replicas count toward nothing.
    pub fn is_copy(&self, id: DnId) -> bool {
        self.role(id) != Role::Shared
    }

    /// Whether `replicas` hold at least one replica on a shared datanode:
    /// a block is never left with copies alone (they count toward
    /// nothing, and other hosts cannot read them).
    pub fn any_shared(&self, replicas: &[DnId]) -> bool {
        replicas.iter().any(|d| !self.is_copy(*d))
    }

    /// How many of `replicas` are on shared datanodes.
    pub fn shared_count(&self, replicas: &[DnId]) -> usize {
        replicas.iter().filter(|d| !self.is_copy(**d)).count()
    }

    /// `replicas` in the order a read tries them: on a mount with
    /// host-local copies, this host's copies first (a local read), then
    /// the rest as listed; else as listed (no allocation on the read path).
    pub fn read_order<'a>(&self, replicas: &'a [DnId]) -> std::borrow::Cow<'a, [DnId]> {
        if !self.here.local_copy {
            return std::borrow::Cow::Borrowed(replicas);
        }
        let mut v = replicas.to_vec();
        v.sort_by_key(|d| self.role(*d) != Role::Here);
        std::borrow::Cow::Owned(v)
    }

    /// The attached datanodes holding this host's copies (each daemon
    /// sweeps its own host's, whoever leads housekeeping).
    pub fn copies_here(&self) -> Vec<Arc<dyn Storage>> {
        self.snapshot()
            .iter()
            .filter(|s| self.role_of(s) == Role::Here)
            .filter_map(|s| s.node.clone())
            .collect()
    }

    /// Datanodes at `dirs` with ids 0, 1, ... in that order and no
    /// identity files.
    #[cfg(test)]
    pub fn unregistered(dirs: &[PathBuf], replication: usize) -> FsResult<Datanodes> {
        let mut nodes = Vec::new();
        for (i, d) in dirs.iter().enumerate() {
            let node = crate::storage::Datanode::open(DnId(i as u32), d, None)?;
            nodes.push(Attached::shared(Arc::new(node)));
        }
        Ok(Datanodes::new(nodes, Vec::new(), replication))
    }

    /// The given datanodes (e.g. faulty ones), all in service.
    #[cfg(test)]
    pub fn of(nodes: Vec<Arc<dyn Storage>>, replication: usize) -> Datanodes {
        let nodes = nodes.into_iter().map(Attached::shared).collect();
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
        self.slot(id).map_or(Health::Dead, |s| self.health_of(&s))
    }

    fn health_of(&self, s: &Slot) -> Health {
        match self.role_of(s) {
            Role::Elsewhere => Health::Elsewhere,
            _ => s.health(),
        }
    }

    /// The operator's state of datanode `id` (`Removed` if not recorded).
    pub fn admin(&self, id: DnId) -> AdminState {
        self.slot(id).map_or(AdminState::Removed, |s| s.admin())
    }

    /// Live or full: its replicas can be read (also while it is being
    /// decommissioned, or decommissioned and not yet removed).
    pub fn is_alive(&self, id: DnId) -> bool {
        matches!(self.health(id), Health::Live | Health::Full)
    }

    /// Alive, in service and shared (not a host's copy): its replicas
    /// count toward the replication factor.
    pub fn counts(&self, id: DnId) -> bool {
        self.slot(id).is_some_and(|s| {
            self.role_of(&s) == Role::Shared
                && matches!(s.health(), Health::Live | Health::Full)
                && s.admin().in_service()
        })
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
    pub fn insert(&self, node: Arc<dyn Storage>, admin: AdminState, host: Option<String>) {
        let id = node.id();
        let slot = Arc::new(Slot::attached(Attached { node, admin, host }));
        self.beat(&slot);
        self.change(|v| {
            v.retain(|s| s.id != id);
            v.push(slot);
        });
    }

    /// Records a datanode another daemon registered that this one cannot
    /// attach (dead here, or another host's copies), in place of what this
    /// daemon knew of it.
    pub fn insert_absent(&self, a: Absent) {
        let id = a.record.id;
        self.change(|v| {
            v.retain(|s| s.id != id);
            v.push(Arc::new(Slot::absent(a)));
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
    /// path (`Err(why)`: dead here). Another host's copies are never
    /// opened, whatever their path is here; a datanode whose host changed
    /// (a directory a mount of another host took as its copy) is seen
    /// anew. Datanodes recorded at mount but left out of this daemon's
    /// list stay out.
    pub fn reconcile(
        &self,
        records: &[DatanodeRecord],
        open: impl Fn(&DatanodeRecord) -> Result<Arc<dyn Storage>, String>,
    ) {
        for r in records {
            let slot = self.slot(r.id);
            match (slot, r.state) {
                (Some(_), AdminState::Removed) => {
                    tracing::warn!(datanode = %r.id, path = %r.path.display(), "datanode removed from the filesystem");
                    self.remove(r.id)
                }
                (None, AdminState::Removed) => {}
                (Some(s), a) if s.host == r.host => self.set_admin(r.id, a),
                (_, a) if self.here.role(r.host.as_deref()) == Role::Elsewhere => {
                    tracing::info!(datanode = %r.id, path = %r.path.display(), host = r.host.as_deref().unwrap_or_default(), "datanode holds another host's copies: not attached here");
                    self.insert_absent(Absent {
                        record: DatanodeRecord {
                            state: a,
                            ..r.clone()
                        },
                        why: elsewhere_why(r.host.as_deref()),
                    })
                }
                (_, a) => match open(r) {
                    Ok(node) => {
                        tracing::info!(datanode = %r.id, path = %r.path.display(), "datanode added by another daemon attached");
                        self.insert(node, a, r.host.clone())
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
            // Never stored: another host's copies are never attached.
            (_, Health::Elsewhere) => {}
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

    /// Chooses up to `n` distinct live, in-service shared datanodes not
    /// in `exclude` with at least `room` bytes free (as of their last
    /// heartbeat), weighted by free space (see [`placement`]). A host's
    /// copies are never chosen here: a copy is made only with a new block
    /// ([`Self::choose_pipeline`]), never as a spare or by a repair.
    pub fn choose_with_room(&self, n: usize, exclude: &[DnId], room: u64) -> Vec<DnId> {
        self.pick(Role::Shared, n, exclude, room)
    }

    /// Up to `n` of the live, in-service datanodes of `role` with room.
    fn pick(&self, role: Role, n: usize, exclude: &[DnId], room: u64) -> Vec<DnId> {
        let cands = self
            .snapshot()
            .iter()
            .filter(|s| {
                s.node.is_some()
                    && self.role_of(s) == role
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
            .filter(|s| {
                s.node.is_some()
                    && self.role_of(s) == Role::Shared
                    && s.health() == Health::Live
                    && s.admin().in_service()
            })
            .map(|s| s.free.load(Ordering::Relaxed))
            .collect();
        free.sort_unstable_by(|a, b| b.cmp(a));
        let k = self.replication.min(free.len());
        match k.checked_sub(1).and_then(|i| free.get(i)) {
            Some(f) => f.saturating_sub(FULL_BELOW),
            None => 0,
        }
    }

    /// Chooses a full pipeline for a new block: R shared datanodes, then,
    /// on a mount with host-local copies, one of this host's copy
    /// datanodes (live, in service, with room) when there is one. Fails
    /// when no shared datanode can take it (with `ENOSPC` when those left
    /// in service are full); a missing copy costs speed only.
    pub fn choose_pipeline(&self) -> FsResult<Vec<DnId>> {
        let mut v = self.choose(self.replication, &[]);
        if !v.is_empty() {
            v.extend(self.pick(Role::Here, 1, &[], 0));
            return Ok(v);
        }
        if self.snapshot().iter().any(|s| {
            self.role_of(s) == Role::Shared && s.health() == Health::Full && s.admin().in_service()
        }) {
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
                let state = self.health_of(s);
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
                    host: s.host.clone(),
                }
            })
            .collect()
    }
}

/// Why a datanode is not attached: it holds another host's copies.
pub fn elsewhere_why(host: Option<&str>) -> String {
    format!(
        "holds the copies of host {} (-o local_copy there): read and swept by that host only",
        host.unwrap_or("?")
    )
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
                host: None,
            },
            why: "not in the --datanode list".into(),
        };
        let node = Attached::shared(Arc::new(node));
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

    #[test]
    fn another_hosts_copies_are_never_attached_counted_or_chosen() {
        let dir = tempfile::tempdir().unwrap();
        let shared = crate::storage::Datanode::open(DnId(0), &dir.path().join("s"), None).unwrap();
        let here = HostCopies {
            host: Some("a".into()),
            local_copy: true,
        };
        let dns =
            Datanodes::new(vec![Attached::shared(Arc::new(shared))], Vec::new(), 1).on_host(here);
        let rec = |id: u32, host: Option<&str>| DatanodeRecord {
            id: DnId(id),
            storage_id: Some(format!("DS-{id}")),
            path: dir.path().join(format!("dn{id}")),
            state: AdminState::Normal,
            host: host.map(str::to_string),
        };
        let mut records = vec![rec(0, None), rec(1, Some("a")), rec(2, Some("b"))];
        let opened = crate::sync::Mutex::new(Vec::new());
        let open = |r: &DatanodeRecord| -> Result<Arc<dyn Storage>, String> {
            crate::sync::lock(&opened).push(r.id);
            crate::storage::Datanode::open(r.id, &r.path, None)
                .map(|d| Arc::new(d) as Arc<dyn Storage>)
                .map_err(|e| e.to_string())
        };
        dns.reconcile(&records, open);
        assert_eq!(
            *crate::sync::lock(&opened),
            [DnId(1)],
            "opened another host's copy"
        );
        assert_eq!(dns.health(DnId(2)), Health::Elsewhere);
        assert!(!dns.is_alive(DnId(2)) && !dns.counts(DnId(2)));
        assert!(
            dns.is_alive(DnId(1)) && !dns.counts(DnId(1)),
            "a copy counts"
        );
        assert!(dns.counts(DnId(0)));
        let st = dns.statuses();
        assert_eq!(
            st.iter().map(|s| s.state_name()).collect::<Vec<_>>(),
            ["live", "live", "elsewhere"]
        );
        assert!(st[2].detail.as_deref().unwrap_or("").contains("host b"));
        assert_eq!(
            dns.copies_here().iter().map(|n| n.id()).collect::<Vec<_>>(),
            [DnId(1)]
        );
        for _ in 0..10 {
            assert_eq!(dns.choose_pipeline().unwrap(), [DnId(0), DnId(1)]);
            assert_eq!(dns.choose(3, &[]), [DnId(0)]);
        }
        assert_eq!(
            dns.read_order(&[DnId(0), DnId(2), DnId(1)]).into_owned(),
            [DnId(1), DnId(0), DnId(2)]
        );
        // Reconciled again: nothing new is opened (no attempt per
        // heartbeat at another host's path).
        dns.reconcile(&records, open);
        assert_eq!(crate::sync::lock(&opened).len(), 1);
        // A mount of this host took host b's directory as its copy, then
        // host b took it back: attached, then left alone again.
        records[2].host = Some("a".into());
        dns.reconcile(&records, open);
        assert!(dns.get(DnId(2)).is_some());
        assert_eq!(dns.health(DnId(2)), Health::Live);
        records[2].host = Some("b".into());
        dns.reconcile(&records, open);
        assert!(dns.get(DnId(2)).is_none());
        assert_eq!(dns.health(DnId(2)), Health::Elsewhere);
        // Copies alone are no pipeline: with the shared one dead, a new
        // block fails rather than go to this host's copy.
        dns.mark_dead(DnId(0));
        assert!(dns.choose_pipeline().is_err());
        assert!(!dns.any_shared(&[DnId(1), DnId(2)]));
    }
}
