//! `fsck`: verifies every block's replicas (present, generation stamp,
//! length, checksums), replication, files left open and stray replica
//! files, and optionally repairs what it can. Shared by the daemon (online,
//! through the control socket) and the offline `fsck --data DIR`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{IsTerminal, Write};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::FsResult;
use crate::meta::{AdminState, BlockRow, DnId, Meta};
use crate::pipeline::Datanodes;
use crate::pipeline::datanodes::{DatanodeStatus, FULL_BELOW, Health};
use crate::storage::quarantine::{self, Quarantined};
use crate::storage::{ReplicaStat, ReplicaState, Storage, StorageError};
use crate::sync::Arc;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProblemKind {
    MissingReplica,
    StaleReplica,
    CorruptReplica,
    BadLength,
    UnderReplicated,
    MissingBlock,
    LeftOpen,
    /// A replica file of a block no file has.
    OrphanReplica,
    /// A copy of a block on a datanode its row does not list, while every
    /// replica the row lists is there (a datanode back from the dead, a
    /// copy left by pipeline recovery): not needed, and no fault.
    ExcessReplica,
    /// Fewer than R replicas on datanodes in service, but R readable ones
    /// counting those on decommissioning datanodes: the decommission is
    /// still copying it. No fault (nothing is less safe than before).
    DecommissionPending,
}

impl ProblemKind {
    /// Whether it makes the filesystem unhealthy (fsck exits 1 until it is
    /// repaired).
    pub fn is_fault(self) -> bool {
        !matches!(
            self,
            ProblemKind::ExcessReplica | ProblemKind::DecommissionPending
        )
    }
}

/// How far the decommission of one datanode is, as one run saw it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Decommission {
    pub datanode: DnId,
    /// Blocks with a replica on it.
    pub blocks: u64,
    /// Of those, blocks not yet held R times by datanodes in service
    /// (after this run's repairs), or still being written.
    pub pending: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Problem {
    pub kind: ProblemKind,
    pub path: String,
    pub block: Option<u64>,
    pub datanode: Option<DnId>,
    pub detail: String,
    pub repaired: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OpenFile {
    pub path: String,
    pub holder: String,
    pub comm: String,
    pub epoch: u64,
    /// A live lease exists (online check only): the file is being written,
    /// not left open.
    pub live: bool,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Report {
    pub files: u64,
    pub blocks: u64,
    pub replicas: u64,
    pub replication: usize,
    /// Live or full (their replicas can be read).
    pub datanodes_alive: usize,
    pub datanodes: usize,
    /// Every recorded datanode and its state (live, full, dead): listed
    /// apart from the problems, which are about blocks and files only.
    pub datanode_states: Vec<DatanodeStatus>,
    pub open_for_write: Vec<OpenFile>,
    pub problems: Vec<Problem>,
    /// Blocks still short of R replicas in service after this run (its
    /// repairs counted), and their bytes: what re-replication has left to
    /// copy.
    #[serde(default)]
    pub under_replicated: u64,
    #[serde(default)]
    pub under_replicated_bytes: u64,
    /// Datanodes being decommissioned and their blocks left to copy.
    #[serde(default)]
    pub decommissioning: Vec<Decommission>,
    /// Replicas of blocks no file has, kept instead of deleted (see
    /// `storage::quarantine`): no fault, shown for an operator to look at.
    #[serde(default)]
    pub quarantined: Vec<InQuarantine>,
    /// Entries left out for a user who may not see their paths (absent
    /// when nothing was).
    #[serde(default, skip_serializing_if = "Hidden::is_empty")]
    pub hidden: Hidden,
}

/// A quarantine entry and the datanode that holds it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InQuarantine {
    pub datanode: DnId,
    #[serde(flatten)]
    pub entry: Quarantined,
}

impl Report {
    fn unrepaired_faults(&self) -> usize {
        self.problems
            .iter()
            .filter(|p| !p.repaired && p.kind.is_fault())
            .count()
            + self.hidden.faults as usize
    }

    /// 0 healthy (or everything repaired), 1 problems remain.
    pub fn exit_code(&self) -> u8 {
        if self.unrepaired_faults() == 0 { 0 } else { 1 }
    }

    /// The status and counters; the status says whether every block is
    /// whole (no block missing, corrupt or under-replicated, no file left
    /// open), whatever state the datanodes are in.
    pub fn summary(&self) -> String {
        let fixed =
            self.problems.iter().filter(|p| p.repaired).count() + self.hidden.repaired as usize;
        let status = if self.unrepaired_faults() == 0 {
            "HEALTHY"
        } else {
            "CORRUPT"
        };
        let count = |h: Health| self.datanode_states.iter().filter(|d| d.state == h).count();
        // Other hosts' copies only where there are some: the line reads
        // as before on one host.
        let elsewhere = match count(Health::Elsewhere) {
            0 => String::new(),
            n => format!(", {n} elsewhere"),
        };
        let mut out = format!(
            "Status: {status}\n Files: {}\n Blocks: {}\n Replicas: {}\n Replication: {}\n Datanodes alive: {}/{} ({} live, {} full, {} dead{elsewhere})\n Open for write: {}\n Problems: {} ({} repaired)",
            self.files,
            self.blocks,
            self.replicas,
            self.replication,
            self.datanodes_alive,
            self.datanodes,
            count(Health::Live),
            count(Health::Full),
            count(Health::Dead),
            self.open_for_write.len() + self.hidden.open_for_write as usize,
            self.problems.len() + self.hidden.problems as usize,
            fixed
        );
        if self.under_replicated > 0 {
            out.push_str(&format!(
                "\n Under-replicated: {} blocks ({} MiB left to copy)",
                self.under_replicated,
                self.under_replicated_bytes.div_ceil(1 << 20)
            ));
        }
        if let Some(first) = self.quarantined.first() {
            out.push_str(&format!(
                "\n Quarantined: {} replicas of blocks no file has (the oldest in {}), kept {} days",
                self.quarantined.len(),
                first.entry.path.display(),
                quarantine::RETENTION.as_secs() / 86_400
            ));
        }
        for d in &self.decommissioning {
            out.push_str(&format!(
                "\n Decommissioning: datanode {}: {} of {} blocks left to copy",
                d.datanode, d.pending, d.blocks
            ));
        }
        if let Some(l) = self.hidden_line() {
            out.push_str(&l);
        }
        out
    }
}

/// The error of a run whose client went away (see [`Check::cancelled`]).
pub const CANCELLED: &str = "fsck cancelled: its client went away";

/// How new an unreferenced rbw replica may be before it counts as an
/// orphan: a writer creates replica files just before recording the block.
pub const ORPHAN_GRACE: Duration = Duration::from_secs(600);

/// Options of one run.
pub struct Check<'a> {
    pub meta: &'a dyn Meta,
    pub dns: &'a Datanodes,
    pub repair: bool,
    /// Files with a live lease (online); offline every open file is left open.
    pub live_leases: HashSet<u64>,
    /// Blocks being written right now (never touched by repair).
    pub busy_blocks: HashSet<u64>,
    pub progress: bool,
    /// Verify every checksum (fsck); housekeeping verifies only `suspect`
    /// replicas (reported by reads) and checks the rest by presence,
    /// generation stamp and length.
    pub deep: bool,
    pub suspect: HashSet<(u64, DnId)>,
    /// Also delete replica files of blocks no file has...
    pub orphans: bool,
    /// ...once they are this old (writers create replica files just before
    /// recording their block; at mount there are no writers yet).
    pub orphan_grace: Duration,
    /// Apply the grace to finalized replicas and excess copies too
    /// (automatic housekeeping is conservative; an operator's `fsck
    /// --repair` on a lone daemon removes them at once).
    pub grace_finalized: bool,
    /// Other daemons write to these datanodes (a namespace shared over
    /// etcd): their blocks in flight are not in this daemon's registry
    /// ([`Datanodes::in_flight`]), so the grace applies to every unknown
    /// replica and excess copy, whatever its state.
    pub shared: bool,
    /// With `repair`, also copy blocks short of R replicas in service
    /// (housekeeping, `fsck --repair`). The sweep at mount does not: a
    /// mount after a disk failure is ready at once, and housekeeping
    /// copies in the background while fsck shows what is left.
    pub copy: bool,
    /// Beside orphans, also delete copies of a block on datanodes its row
    /// does not list, once the row's own replicas are all there (excess or
    /// stale copies; never at mount).
    pub excess: bool,
    /// Keeps writers off a file while a repair changes it; `None` when a
    /// writer holds it now (it may have opened it since the check began).
    /// Online this is the lease manager's pin; offline [`no_writers`].
    pub pin: &'a dyn Fn(u64) -> Option<Pinned<'a>>,
    /// Recovers a file left under construction (called pinned).
    pub recover: &'a dyn Fn(u64) -> FsResult<u64>,
    /// Whoever asked is gone (an online fsck whose client disconnected):
    /// asked before each block, and the run ends there with an error, so
    /// that a check nobody waits for stops reading replicas.
    pub cancelled: &'a dyn Fn() -> bool,
}

/// The [`Check::cancelled`] of a run that always goes to its end.
pub fn never_cancelled() -> bool {
    false
}

/// A file kept from writers while a repair changes it; let go on drop.
pub struct Pinned<'a>(Option<Box<dyn FnOnce() + 'a>>);

impl<'a> Pinned<'a> {
    pub fn new(release: impl FnOnce() + 'a) -> Pinned<'a> {
        Pinned(Some(Box::new(release)))
    }
}

impl Drop for Pinned<'_> {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f()
        }
    }
}

/// The pin of an offline check: no daemon, so no writer.
pub fn no_writers<'a>(_: u64) -> Option<Pinned<'a>> {
    Some(Pinned(None))
}

struct Progress {
    on: bool,
    total: usize,
    done: usize,
}

impl Progress {
    fn tick(&mut self) {
        self.done += 1;
        if self.on && (self.done.is_multiple_of(64) || self.done == self.total) {
            let width = 30;
            let filled = width * self.done / self.total.max(1);
            eprint!(
                "\r[{}{}] {}/{} blocks",
                "#".repeat(filled),
                " ".repeat(width - filled),
                self.done,
                self.total
            );
            let _ = std::io::stderr().flush();
            if self.done == self.total {
                eprintln!();
            }
        }
    }
}

mod block;
mod hidden;
use block::check_block;
pub use hidden::Hidden;

pub fn run(c: &Check<'_>) -> Result<Report, String> {
    let states = c.dns.statuses();
    let mut r = Report {
        replication: c.dns.replication,
        datanodes: states.len(),
        datanodes_alive: states
            .iter()
            .filter(|d| matches!(d.state, Health::Live | Health::Full))
            .count(),
        datanode_states: states,
        ..Report::default()
    };
    let (files, _) = c.meta.usage().map_err(|e| e.to_string())?;
    r.files = files;
    let blocks = c.meta.all_blocks().map_err(|e| e.to_string())?;
    r.blocks = blocks.len() as u64;
    let mut progress = Progress {
        on: c.progress && std::io::stderr().is_terminal(),
        total: blocks.len(),
        done: 0,
    };
    let mut paths: HashMap<u64, String> = HashMap::new();
    let mut decom: BTreeMap<DnId, Decommission> = r
        .datanode_states
        .iter()
        .filter(|d| d.admin == AdminState::Decommissioning)
        .map(|d| {
            let z = Decommission {
                datanode: d.id,
                blocks: 0,
                pending: 0,
            };
            (d.id, z)
        })
        .collect();
    for b in &blocks {
        if (c.cancelled)() {
            return Err(CANCELLED.into());
        }
        let path = paths
            .entry(b.ino)
            .or_insert_with(|| c.meta.path_of(b.ino))
            .clone();
        let in_service = check_block(c, b, &path, &mut r);
        for dn in &b.replicas {
            if let Some(d) = decom.get_mut(dn) {
                d.blocks += 1;
                if !b.finalized
                    || c.busy_blocks.contains(&b.block_id)
                    || in_service < c.dns.replication
                {
                    d.pending += 1;
                }
            }
        }
        progress.tick();
    }
    r.decommissioning = decom.into_values().collect();
    for uc in c.meta.list_uc().map_err(|e| e.to_string())? {
        let path = c.meta.path_of(uc.ino);
        let live = c.live_leases.contains(&uc.ino);
        r.open_for_write.push(OpenFile {
            path: path.clone(),
            holder: uc.holder.clone(),
            comm: uc.comm.clone(),
            epoch: uc.epoch,
            live,
        });
        if !live {
            let mut p = Problem {
                kind: ProblemKind::LeftOpen,
                path,
                block: None,
                datanode: None,
                detail: format!(
                    "under construction by {} ({}) with no live lease",
                    uc.holder, uc.comm
                ),
                repaired: false,
            };
            if c.repair {
                // Only with the file kept from writers, and only if it is
                // still under construction then: a writer may have opened
                // it since the live set was taken, or be closing it right
                // now (its lease goes only after its close is recorded).
                let Some(_pin) = (c.pin)(uc.ino) else {
                    if let Some(f) = r.open_for_write.last_mut() {
                        f.live = true;
                    }
                    continue;
                };
                match c.meta.uc(uc.ino) {
                    Ok(Some(_)) => {}
                    // Closed meanwhile.
                    Ok(None) => {
                        r.open_for_write.pop();
                        continue;
                    }
                    Err(e) => {
                        p.detail.push_str(&format!("; cannot read it again: {e}"));
                        r.problems.push(p);
                        continue;
                    }
                }
                match (c.recover)(uc.ino) {
                    Ok(_) => p.repaired = true,
                    Err(e) => p.detail.push_str(&format!("; recovery failed: {e}")),
                }
            }
            r.problems.push(p);
        }
    }
    if c.orphans {
        orphans(c, &c.dns.attached(), &blocks, &mut r);
    }
    Ok(r)
}

/// The orphan sweep of this host's copies alone (`-o local_copy`): what
/// every daemon that does not lead housekeeping runs, since the leader,
/// on another host, cannot reach them. Same rules as the leader's sweep
/// (the grace, replicas this daemon has in flight, the metadata read
/// again and made durable first).
pub fn sweep_copies(c: &Check<'_>) -> Result<Report, String> {
    let nodes = c.dns.copies_here();
    let mut r = Report::default();
    if nodes.is_empty() {
        return Ok(r);
    }
    let blocks = c.meta.all_blocks().map_err(|e| e.to_string())?;
    orphans(c, &nodes, &blocks, &mut r);
    Ok(r)
}

/// Copies a finalized block from a good replica (on any datanode that can
/// be read) to live datanodes in service with room that do not hold it,
/// `need` times at most; returns the datanodes added.
pub fn replicate(dns: &Datanodes, b: &BlockRow, good: &[DnId], need: usize) -> Vec<DnId> {
    let mut added = Vec::new();
    let Some(src) = good.first().and_then(|d| dns.get(*d)) else {
        return added;
    };
    for dn in dns.choose_with_room(dns.len(), good, b.len.saturating_add(FULL_BELOW)) {
        if added.len() >= need {
            break;
        }
        let Some(dst) = dns.get(dn) else { continue };
        match dst.copy_replica_from(&*src, b.block_id, b.gs, b.len, ReplicaState::Finalized) {
            Ok(()) => {
                tracing::info!(block = b.block_id, datanode = %dn, "block re-replicated");
                added.push(dn);
            }
            Err(e) => {
                tracing::warn!(
                    block = b.block_id,
                    datanode = %dn,
                    "re-replication failed: {e}"
                );
                if matches!(e, StorageError::NoSpace { .. }) {
                    dns.mark_failed(dn, &e);
                }
            }
        }
    }
    added
}

/// Replica files on `nodes` no block needs: those of blocks no file has
/// (always), and, with [`Check::excess`], copies of a block on datanodes
/// its row does not list, once every replica the row lists is there.
/// Nothing else is ever deleted here, and only after the metadata that
/// says so is durable.
fn orphans(c: &Check<'_>, nodes: &[Arc<dyn Storage>], blocks: &[BlockRow], r: &mut Report) {
    if c.repair
        && let Err(e) = c.meta.sync_if_needed()
    {
        tracing::error!("orphan sweep skipped: the metadata cannot be made durable: {e}");
        return;
    }
    let known: HashMap<u64, &BlockRow> = blocks.iter().map(|b| (b.block_id, b)).collect();
    for node in nodes {
        let i = node.id();
        if !c.dns.is_alive(i) {
            continue;
        }
        let Ok(list) = node.list() else { continue };
        for info in list {
            let referenced = known
                .get(&info.block)
                .is_some_and(|b| b.replicas.contains(&i));
            if referenced || c.busy_blocks.contains(&info.block) {
                continue;
            }
            // A replica is created just before its block is recorded, so a
            // young rbw one may be about to be referenced (and, of another
            // daemon's, a young one of any kind).
            let young = (info.state == ReplicaState::Rbw || c.grace_finalized || c.shared)
                && node
                    .replica_age(&info)
                    .is_some_and(|age| age < c.orphan_grace);
            if young {
                continue;
            }
            // A block this daemon is writing or copying may be recorded by
            // a commit in flight. Asked before the metadata is read again:
            // a writer lets go only after its commit returned, so a block
            // no longer held here is recorded by then, or truly unknown.
            if c.dns.in_flight(info.block) {
                continue;
            }
            // The table read at the start may be older than this replica's
            // block (a file created during the run): look again first.
            let (kind, detail) = match c.meta.block_by_id(info.block) {
                Ok(None) => (ProblemKind::OrphanReplica, "replica of no file".to_string()),
                Ok(Some(row))
                    if !row.replicas.contains(&i) && c.excess && is_whole(c.dns, &row) =>
                {
                    (
                        ProblemKind::ExcessReplica,
                        format!(
                            "copy of a block whose {} recorded replicas are all there (generation stamp {}, the block's is {})",
                            row.replicas.len(),
                            info.gs,
                            row.gs
                        ),
                    )
                }
                // Recorded here, or possibly still needed, or unknown.
                Ok(Some(_)) | Err(_) => continue,
            };
            let mut p = Problem {
                kind,
                path: info.data_path.display().to_string(),
                block: Some(info.block),
                datanode: Some(i),
                detail,
                repaired: false,
            };
            if c.repair {
                // Unknown is a guess (a restored meta.db forgets newer
                // blocks): moved aside, never deleted on it. A host's copy
                // is never a block's only replica (a block keeps one on a
                // shared datanode, which the leader quarantines if need
                // be): deleted.
                let done = match kind {
                    ProblemKind::OrphanReplica if !c.dns.is_copy(i) => {
                        node.quarantine(info.block).map(|to| {
                            p.detail = format!("{}; moved to {}", p.detail, to.display());
                        })
                    }
                    _ => node.delete(info.block),
                };
                match done {
                    Ok(()) => p.repaired = true,
                    Err(e) => p.detail = format!("{}; not removed: {e}", p.detail),
                }
            }
            r.problems.push(p);
        }
    }
    for node in nodes {
        match node.quarantined() {
            Ok(list) => r
                .quarantined
                .extend(list.into_iter().map(|entry| InQuarantine {
                    datanode: node.id(),
                    entry,
                })),
            Err(e) => tracing::warn!(datanode = %node.id(), "cannot list the quarantine: {e}"),
        }
    }
}

/// Whether a finalized block has at least the replication factor of
/// replicas recorded on shared datanodes in service, each live at the
/// block's generation stamp and length (copies it lists on
/// decommissioning datanodes, and host-local copies, aside): then no
/// other copy of it is needed.
pub fn is_whole(dns: &Datanodes, row: &BlockRow) -> bool {
    let mut whole = 0;
    for &dn in &row.replicas {
        if !dns.is_recorded(dn) || dns.is_copy(dn) || !dns.admin(dn).in_service() {
            continue;
        }
        let ok = dns.is_alive(dn)
            && dns.get(dn).is_some_and(|n| {
                matches!(n.stat_replica(row.block_id, row.gs), Ok(ReplicaStat { state: ReplicaState::Finalized, data_len }) if data_len == row.len)
            });
        if !ok {
            return false;
        }
        whole += 1;
    }
    row.finalized && whole >= dns.replication
}
