//! Datanode administration on a running daemon (`leasefs datanode list |
//! add | decommission | remove | balance`), after HDFS's `dfsadmin
//! -report`, decommissioning and balancer: what each datanode holds and
//! how it is doing, attaching a directory, starting a decommission (the
//! copying itself is housekeeping's, see [`crate::housekeeping`]) and
//! reporting how far it is, removing a datanode from the registry, and
//! moving replicas between datanodes ([`balance`]). The rules are in
//! docs/SEMANTICS.md, "Datanode administration".

pub mod balance;
pub mod control;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::fs::Core;
use crate::housekeeping::Housekeeper;
use crate::meta::{AdminState, BlockRow, DnId};
use crate::pipeline::Health;
use crate::pipeline::attach;
use crate::storage::identity;
use crate::storage::{ReplicaStat, ReplicaState};
use crate::sync::{Arc, Mutex, lock};

/// Why an administration request was refused or failed: one line for the
/// user.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("{} is not a datanode of this filesystem", .0.display())]
    Unknown(PathBuf),
    #[error(
        "decommissioning {} would leave {left} datanode(s) in service for replication {replication}: add one first (leasefs datanode add)",
        .path.display()
    )]
    TooFew {
        path: PathBuf,
        left: usize,
        replication: usize,
    },
    #[error(
        "{} holds the only good replica of {blocks} block(s) of {} file(s) ({}); decommission it first, or remove it with --force and lose them",
        .path.display(), .files.len(), sample(.files)
    )]
    OnlyReplica {
        path: PathBuf,
        blocks: usize,
        files: Vec<String>,
    },
    #[error(transparent)]
    Attach(#[from] attach::AttachError),
    #[error("{0}")]
    Failed(String),
}

impl From<crate::error::FsError> for AdminError {
    fn from(e: crate::error::FsError) -> Self {
        AdminError::Failed(e.to_string())
    }
}

fn sample(files: &[String]) -> String {
    let mut s = files.iter().take(3).cloned().collect::<Vec<_>>().join(", ");
    if files.len() > 3 {
        s.push_str(", ...");
    }
    s
}

/// One line of `leasefs datanode list` (HDFS's `dfsadmin -report`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DatanodeInfo {
    pub id: DnId,
    pub storage_id: Option<String>,
    pub path: PathBuf,
    /// `live`, `full` or `dead`; while it is alive, `decommissioning` or
    /// `decommissioned` when the operator made it so; `elsewhere` for
    /// another host's copies.
    pub state: String,
    pub health: Health,
    pub admin: AdminState,
    /// Bytes of the replicas the metadata records on it.
    pub used_bytes: u64,
    /// Free bytes of its filesystem at its last heartbeat (attached only).
    pub free_bytes: Option<u64>,
    /// Size of its filesystem (attached only).
    pub capacity_bytes: Option<u64>,
    /// Replicas the metadata records on it.
    pub blocks: u64,
    /// Wall-clock ms of its last good heartbeat on this daemon.
    pub last_heartbeat_ms: Option<u64>,
    pub detail: Option<String>,
    /// The host whose copies it holds (`None`: shared).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
}

/// How far a decommission is.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Progress {
    pub id: DnId,
    pub path: PathBuf,
    pub admin: AdminState,
    /// Blocks with a replica on the datanode.
    pub blocks: u64,
    /// Of those, blocks not yet held R times by live datanodes in service
    /// (as the metadata records them), or still being written.
    pub pending: u64,
    pub pending_bytes: u64,
    /// Live datanodes in service that can take copies.
    pub targets: usize,
    pub replication: usize,
}

/// What `remove` did.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Removed {
    pub id: DnId,
    pub path: PathBuf,
    /// Files that lost blocks (only with `--force`).
    pub lost_files: Vec<String>,
    pub lost_blocks: usize,
}

/// The administration service of one daemon.
pub struct Admin {
    core: Arc<Core>,
    hk: Arc<Housekeeper>,
    balancer: Mutex<Option<Arc<balance::Job>>>,
}

/// Replicas and bytes the metadata records on each datanode.
fn usage(blocks: &[BlockRow]) -> BTreeMap<DnId, (u64, u64)> {
    let mut m: BTreeMap<DnId, (u64, u64)> = BTreeMap::new();
    for b in blocks {
        for dn in &b.replicas {
            let e = m.entry(*dn).or_default();
            e.0 += 1;
            e.1 += b.len;
        }
    }
    m
}

/// Size of the filesystem holding `dir`.
pub fn capacity(dir: &Path) -> Option<u64> {
    let st = nix::sys::statvfs::statvfs(dir).ok()?;
    Some((st.blocks() as u64).saturating_mul(st.fragment_size() as u64))
}

/// Brings the daemon's datanodes in line with the registry (another
/// daemon's `add`, `decommission`, `remove`, or a decommission finished by
/// the housekeeping leader elsewhere). Runs with the heartbeats.
pub fn refresh(core: &Core) {
    let (fsid, records) = match (core.meta().filesystem_id(), core.meta().datanode_records()) {
        (Ok(f), Ok(r)) => (f, r),
        (Err(e), _) | (_, Err(e)) => {
            tracing::debug!("datanode registry not read: {e}");
            return;
        }
    };
    core.dns()
        .reconcile(&records, |r| attach::open_recorded(&fsid, r));
}

impl Admin {
    pub fn new(core: Arc<Core>, hk: Arc<Housekeeper>) -> Arc<Admin> {
        Arc::new(Admin {
            core,
            hk,
            balancer: Mutex::new(None),
        })
    }

    /// The datanode `dir` names: a storage ID (`DS-...`) as it is, a
    /// directory by its identity file when it can be read, else by the
    /// path it is (or was last) attached at.
    pub fn resolve(&self, dir: &Path) -> Result<DnId, AdminError> {
        let records = self.core.meta().datanode_records()?;
        let live = |id: DnId| self.core.dns().is_recorded(id);
        if let Some(sid) = dir.to_str().filter(|s| s.starts_with("DS-")) {
            return records
                .iter()
                .find(|r| r.storage_id.as_deref() == Some(sid) && live(r.id))
                .map(|r| r.id)
                .ok_or_else(|| AdminError::Unknown(dir.to_path_buf()));
        }
        if let Ok(Some(found)) = identity::read(dir)
            && let Some(r) = records
                .iter()
                .find(|r| r.storage_id.as_deref() == Some(&*found.storage_id))
            && live(r.id)
        {
            return Ok(r.id);
        }
        if let Some(d) = self.core.dns().statuses().iter().find(|d| d.path == dir) {
            return Ok(d.id);
        }
        records
            .iter()
            .find(|r| r.path == dir && live(r.id))
            .map(|r| r.id)
            .ok_or_else(|| AdminError::Unknown(dir.to_path_buf()))
    }

    /// Every datanode the filesystem records, with what it holds.
    pub fn list(&self) -> Result<Vec<DatanodeInfo>, AdminError> {
        let used = usage(&self.core.meta().all_blocks()?);
        Ok(self
            .core
            .dns()
            .statuses()
            .into_iter()
            .map(|d| {
                let (blocks, used_bytes) = used.get(&d.id).copied().unwrap_or_default();
                let state = d.state_name();
                DatanodeInfo {
                    id: d.id,
                    storage_id: d.storage_id,
                    capacity_bytes: self.core.dns().get(d.id).and_then(|n| capacity(n.root())),
                    path: d.path,
                    state: state.into(),
                    health: d.state,
                    admin: d.admin,
                    used_bytes,
                    free_bytes: d.free_bytes,
                    blocks,
                    last_heartbeat_ms: d.last_heartbeat_ms,
                    detail: d.detail,
                    host: d.host,
                }
            })
            .collect())
    }

    /// `datanode add`: attaches `dir` now; new blocks may use it at once.
    pub fn add(&self, dir: &Path) -> Result<DnId, AdminError> {
        let id = attach::attach_one(&**self.core.meta(), self.core.dns(), dir)?;
        self.hk.kick();
        Ok(id)
    }

    /// `datanode decommission`: records the decommission (or finds it
    /// under way, or done) and asks housekeeping to start copying.
    pub fn decommission(&self, dir: &Path) -> Result<Progress, AdminError> {
        let id = self.resolve(dir)?;
        let dns = self.core.dns();
        if dns.admin(id).in_service() {
            // Shared datanodes alive and in service besides it (a host's
            // copies count toward nothing; one of them may always go).
            let left = dns
                .statuses()
                .iter()
                .filter(|d| {
                    d.id != id
                        && d.host.is_none()
                        && d.admin.in_service()
                        && matches!(d.state, Health::Live | Health::Full)
                })
                .count();
            if left < dns.replication && !dns.is_copy(id) {
                return Err(AdminError::TooFew {
                    path: dir.to_path_buf(),
                    left,
                    replication: dns.replication,
                });
            }
            let was = self.core.meta().set_datanode_state(
                id,
                &[AdminState::Normal, AdminState::Upgrading],
                AdminState::Decommissioning,
            )?;
            let now = if was.in_service() {
                tracing::info!(datanode = %id, path = %dir.display(), "decommission started");
                AdminState::Decommissioning
            } else {
                was
            };
            dns.set_admin(id, now);
        }
        self.hk.kick();
        self.progress(id)
    }

    /// How far the decommission of datanode `id` is, from the block rows
    /// (any daemon can tell, whichever leads housekeeping).
    pub fn progress(&self, id: DnId) -> Result<Progress, AdminError> {
        let dns = self.core.dns();
        let st = dns
            .statuses()
            .into_iter()
            .find(|d| d.id == id)
            .ok_or_else(|| AdminError::Failed(format!("datanode {id} was removed")))?;
        let live = self.core.live_files().unwrap_or_default();
        let mut p = Progress {
            id,
            path: st.path,
            admin: st.admin,
            blocks: 0,
            pending: 0,
            pending_bytes: 0,
            targets: dns
                .statuses()
                .iter()
                .filter(|d| d.host.is_none() && d.admin.in_service() && d.state == Health::Live)
                .count(),
            replication: dns.replication,
        };
        for b in self.core.meta().all_blocks()? {
            if !b.replicas.contains(&id) {
                continue;
            }
            p.blocks += 1;
            let held = b.replicas.iter().filter(|d| dns.counts(**d)).count();
            if !b.finalized || live.contains(&b.ino) || held < dns.replication {
                p.pending += 1;
                p.pending_bytes += b.len;
            }
        }
        Ok(p)
    }

    /// `datanode remove`: refused while `dir` holds the only good replica
    /// of a block, unless `force`; then the datanode leaves the registry
    /// and every block row (one durable step), and this daemon stops using
    /// it. Its directory is left as it is.
    pub fn remove(&self, dir: &Path, force: bool) -> Result<Removed, AdminError> {
        let id = self.resolve(dir)?;
        let dns = self.core.dns();
        let path = dns
            .statuses()
            .into_iter()
            .find(|d| d.id == id)
            .map_or_else(|| dir.to_path_buf(), |d| d.path);
        let mut lost_blocks = 0;
        let mut files = BTreeSet::new();
        for b in self.core.meta().all_blocks()? {
            if b.replicas.contains(&id) && !held_elsewhere(&self.core, &b, id) {
                lost_blocks += 1;
                files.insert(self.core.meta().path_of(b.ino));
            }
        }
        let files: Vec<String> = files.into_iter().collect();
        if lost_blocks > 0 && !force {
            return Err(AdminError::OnlyReplica {
                path,
                blocks: lost_blocks,
                files,
            });
        }
        self.core.meta().remove_datanode(id)?;
        dns.remove(id);
        if lost_blocks > 0 {
            tracing::error!(datanode = %id, path = %path.display(), blocks = lost_blocks, files = ?files, "datanode removed by force: these files lost data");
        } else {
            tracing::info!(datanode = %id, path = %path.display(), "datanode removed");
        }
        self.hk.kick();
        Ok(Removed {
            id,
            path,
            lost_files: files,
            lost_blocks,
        })
    }

    /// `datanode balance`: starts the balancer on this daemon (or returns
    /// the one running).
    pub fn balance(&self, threshold_pct: f64) -> balance::Status {
        let mut g = lock(&self.balancer);
        if let Some(j) = g.as_ref().filter(|j| j.running()) {
            return j.status();
        }
        let job = balance::Job::start(self.core.clone(), threshold_pct);
        let st = job.status();
        *g = Some(job);
        st
    }

    /// The balancer's state, if it ran since the daemon started.
    pub fn balance_status(&self) -> Option<balance::Status> {
        lock(&self.balancer).as_ref().map(|j| j.status())
    }
}

/// Whether block `b` has a good replica on a shared datanode other than
/// `id` (a host's copy does not keep a block: other hosts cannot read
/// it): a live (or full) one whose replica is there at the block's
/// generation stamp (and length, once finalized).
fn held_elsewhere(core: &Core, b: &BlockRow, id: DnId) -> bool {
    b.replicas.iter().any(|&dn| {
        dn != id
            && !core.dns().is_copy(dn)
            && core.dns().is_alive(dn)
            && core
                .dns()
                .get(dn)
                .is_some_and(|n| match n.stat_replica(b.block_id, b.gs) {
                    Ok(ReplicaStat {
                        state: ReplicaState::Finalized,
                        data_len,
                    }) => !b.finalized || data_len == b.len,
                    Ok(ReplicaStat {
                        state: ReplicaState::Rbw,
                        ..
                    }) => !b.finalized,
                    Err(_) => false,
                })
    })
}
