//! `fsck`: verifies every block's replicas (present, generation stamp,
//! length, checksums), replication, files left open and stray replica
//! files, and optionally repairs what it can. Shared by the daemon (online,
//! through the control socket) and the offline `fsck --data DIR`.

use std::collections::{HashMap, HashSet};
use std::io::{IsTerminal, Write};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::error::FsResult;
use crate::meta::{BlockRow, Change, DnId, Meta};
use crate::pipeline::Datanodes;
use crate::pipeline::datanodes::{DatanodeStatus, FULL_BELOW, Health};
use crate::storage::datanode::{ReplicaState, StorageError};

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
}

impl ProblemKind {
    /// Whether it makes the filesystem unhealthy (fsck exits 1 until it is
    /// repaired).
    pub fn is_fault(self) -> bool {
        self != ProblemKind::ExcessReplica
    }
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
}

impl Report {
    fn unrepaired_faults(&self) -> usize {
        self.problems
            .iter()
            .filter(|p| !p.repaired && p.kind.is_fault())
            .count()
    }

    /// 0 healthy (or everything repaired), 1 problems remain.
    pub fn exit_code(&self) -> u8 {
        if self.unrepaired_faults() == 0 { 0 } else { 1 }
    }

    /// The status and counters; the status says whether every block is
    /// whole (no block missing, corrupt or under-replicated, no file left
    /// open), whatever state the datanodes are in.
    pub fn summary(&self) -> String {
        let fixed = self.problems.iter().filter(|p| p.repaired).count();
        let status = if self.unrepaired_faults() == 0 {
            "HEALTHY"
        } else {
            "CORRUPT"
        };
        let count = |h: Health| self.datanode_states.iter().filter(|d| d.state == h).count();
        format!(
            "Status: {status}\n Files: {}\n Blocks: {}\n Replicas: {}\n Replication: {}\n Datanodes alive: {}/{} ({} live, {} full, {} dead)\n Open for write: {}\n Problems: {} ({} repaired)",
            self.files,
            self.blocks,
            self.replicas,
            self.replication,
            self.datanodes_alive,
            self.datanodes,
            count(Health::Live),
            count(Health::Full),
            count(Health::Dead),
            self.open_for_write.len(),
            self.problems.len(),
            fixed
        )
    }
}

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
    /// Apply the grace to finalized replicas too (automatic housekeeping is
    /// conservative; an operator's `fsck --repair` removes them at once).
    pub grace_finalized: bool,
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

pub fn run(c: &Check<'_>) -> Result<Report, String> {
    let states = c.dns.statuses();
    let mut r = Report {
        replication: c.dns.replication,
        datanodes: states.len(),
        datanodes_alive: states.iter().filter(|d| d.state != Health::Dead).count(),
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
    for b in &blocks {
        let path = paths
            .entry(b.ino)
            .or_insert_with(|| c.meta.path_of(b.ino))
            .clone();
        check_block(c, b, &path, &mut r);
        progress.tick();
    }
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
                // it since the check began, or be closing it right now
                // (its lease goes only after its close is recorded).
                let Some(_pin) = (c.pin)(uc.ino) else {
                    continue;
                };
                match c.meta.uc(uc.ino) {
                    Ok(Some(_)) => {}
                    _ => continue,
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
        orphans(c, &blocks, &mut r);
    }
    Ok(r)
}

/// What the replicas of one block were found to be.
#[derive(Default)]
struct Inspection {
    good: Vec<DnId>,
    bad: Vec<(DnId, ProblemKind, String)>,
    /// Replicas on dead datanodes (not attached, or failing heartbeats):
    /// unreadable for now, so the block counts as under-replicated; they
    /// stay recorded until the block has its replicas elsewhere.
    dead: Vec<DnId>,
    /// Replicas whose generation stamp lags the recorded one: (datanode,
    /// stamp found). The metadata recorded a change (a bump, a truncation,
    /// recovery) durably before making it on the replicas; a crash in
    /// between leaves them behind, still members of the block.
    lagging: Vec<(DnId, u64)>,
    /// Replicas whose stamp is one the metadata never recorded (of these
    /// `bad` has an entry too): what a bump made on disk before its record
    /// leaves, as versions before this one did.
    leading: Vec<(DnId, u64)>,
}

fn inspect(c: &Check<'_>, b: &BlockRow) -> Inspection {
    let mut ins = Inspection::default();
    for &dn in &b.replicas {
        if c.dns.health(dn) == Health::Dead {
            ins.dead.push(dn);
            continue;
        }
        let Some(node) = c.dns.get(dn) else {
            ins.dead.push(dn);
            continue;
        };
        let data_len = match node.stat_replica(b.block_id, b.gs) {
            Ok((_, len)) => len,
            Err(StorageError::StaleGenStamp { found, .. }) if found < b.gs => {
                ins.lagging.push((dn, found));
                continue;
            }
            Err(StorageError::StaleGenStamp { found, .. }) => {
                ins.bad.push((
                    dn,
                    ProblemKind::StaleReplica,
                    format!("generation stamp {found} (expected {})", b.gs),
                ));
                ins.leading.push((dn, found));
                continue;
            }
            Err(StorageError::Missing { .. }) => {
                ins.bad
                    .push((dn, ProblemKind::MissingReplica, "no replica files".into()));
                continue;
            }
            Err(e) => {
                ins.bad
                    .push((dn, ProblemKind::MissingReplica, e.to_string()));
                continue;
            }
        };
        if !b.finalized {
            // Being written or left open: its length is settled by recovery.
            ins.good.push(dn);
            continue;
        }
        if data_len != b.len {
            ins.bad.push((
                dn,
                ProblemKind::BadLength,
                format!("length {data_len} (expected {})", b.len),
            ));
            continue;
        }
        if !c.deep && !c.suspect.contains(&(b.block_id, dn)) {
            ins.good.push(dn);
            continue;
        }
        match node.valid_prefix(b.block_id, b.gs) {
            Ok(n) if n >= b.len => ins.good.push(dn),
            Ok(n) => ins.bad.push((
                dn,
                ProblemKind::CorruptReplica,
                format!("checksum mismatch at byte {n}"),
            )),
            Err(e) => ins
                .bad
                .push((dn, ProblemKind::CorruptReplica, e.to_string())),
        }
    }
    ins
}

fn check_block(c: &Check<'_>, b: &BlockRow, path: &str, r: &mut Report) {
    r.replicas += b.replicas.len() as u64;
    let ins = inspect(c, b);
    let want = c.dns.replication;
    let healthy = ins.bad.is_empty() && ins.lagging.is_empty() && ins.good.len() >= want;
    let repairable = c.repair && b.finalized && !c.busy_blocks.contains(&b.block_id);
    if healthy || !repairable {
        // A block being written (or left open) is settled by recovery:
        // its lagging replicas are members, not problems.
        let lagging_ok = !b.finalized;
        report(b, path, &ins, lagging_ok, want, None, r);
        return;
    }
    repair_block(c, b, path, ins, r);
}

/// Records the problems of an inspection; `fixed` says what a repair did
/// (`None`: nothing was repaired). `lagging_ok`: lagging replicas are
/// members in good standing (a block being written or left open, which
/// recovery settles).
fn report(
    b: &BlockRow,
    path: &str,
    ins: &Inspection,
    lagging_ok: bool,
    want: usize,
    fixed: Option<&Repaired>,
    r: &mut Report,
) {
    let problem = |kind, dn: Option<DnId>, detail: String, repaired| Problem {
        kind,
        path: path.to_string(),
        block: Some(b.block_id),
        datanode: dn,
        detail,
        repaired,
    };
    for (dn, kind, detail) in &ins.bad {
        let repaired = fixed.is_some_and(|f| f.dropped.contains(dn));
        r.problems
            .push(problem(*kind, Some(*dn), detail.clone(), repaired));
    }
    if !lagging_ok {
        for (dn, found) in &ins.lagging {
            let repaired = fixed.is_some_and(|f| f.settled.iter().any(|(d, _)| d == dn));
            let detail = if *found < b.gs {
                format!(
                    "generation stamp {found} lags the recorded {} (a change recorded before a crash did not reach this replica)",
                    b.gs
                )
            } else {
                format!(
                    "generation stamp {found} leads the recorded {} (its change was never recorded)",
                    b.gs
                )
            };
            r.problems.push(problem(
                ProblemKind::StaleReplica,
                Some(*dn),
                detail,
                repaired,
            ));
        }
    }
    let usable = ins.good.len() + if lagging_ok { ins.lagging.len() } else { 0 };
    if usable == 0 {
        let detail = if ins.dead.is_empty() {
            "no good replica left".to_string()
        } else {
            format!(
                "no good replica on a live datanode (dead: {})",
                list(&ins.dead)
            )
        };
        r.problems
            .push(problem(ProblemKind::MissingBlock, None, detail, false));
    } else if usable < want {
        let have = fixed.map(|f| f.good_now);
        let mut detail = format!("{usable} of {want} replicas");
        if !ins.dead.is_empty() {
            detail.push_str(&format!(" (on dead datanodes: {})", list(&ins.dead)));
        }
        let mut p = problem(
            ProblemKind::UnderReplicated,
            None,
            detail,
            have.is_some_and(|h| h >= want),
        );
        if let Some(h) = have.filter(|h| *h < want) {
            p.detail
                .push_str(&format!("; only {h} datanodes could take a copy"));
        }
        r.problems.push(p);
    }
}

/// What a repair did.
#[derive(Default)]
struct Repaired {
    /// Replicas taken out of the block (and deleted).
    dropped: Vec<DnId>,
    /// Lagging replicas brought to the recorded state (with the stamp
    /// they had).
    settled: Vec<(DnId, u64)>,
    /// Good replicas the block has now.
    good_now: usize,
}

/// Repairs one finalized block: lagging replicas settled, missing or bad
/// ones replaced by copies of a good one, and a block no replica holds
/// whole cut back to what survives (a never-synced tail a power cut took).
/// Copies are made first (they take time); then, with the file kept from
/// writers, the block must still be as inspected for the repair to be
/// recorded, durably, before any bad replica is deleted.
fn repair_block(c: &Check<'_>, b: &BlockRow, path: &str, mut ins: Inspection, r: &mut Report) {
    let want = c.dns.replication;
    let mut added = Vec::new();
    if !ins.good.is_empty() && ins.good.len() < want {
        added = replicate(c.dns, b, &ins.good, want);
    }
    let forget_copies = |added: &[DnId]| {
        for dn in added {
            if let Some(node) = c.dns.get(*dn) {
                let _ = node.delete_recorded(b.block_id, b.gs);
            }
        }
    };
    let Some(_pin) = (c.pin)(b.ino) else {
        // A writer has the file now: the next round looks again.
        forget_copies(&added);
        report(b, path, &ins, false, want, None, r);
        return;
    };
    let current = c
        .meta
        .blocks(b.ino)
        .ok()
        .and_then(|rows| rows.into_iter().find(|x| x.block_id == b.block_id));
    if current.as_ref() != Some(b) {
        // Changed since the check read it (written, truncated, removed).
        forget_copies(&added);
        return;
    }
    let mut done = Repaired::default();
    // Lagging replicas are settled only when none is at the recorded stamp
    // (a crash between the record and every replica); beside good ones
    // they are stale, replaced by copies.
    if !ins.good.is_empty() {
        for (dn, found) in std::mem::take(&mut ins.lagging) {
            ins.bad.push((
                dn,
                ProblemKind::StaleReplica,
                format!("generation stamp {found} (expected {})", b.gs),
            ));
        }
    }
    for (dn, found) in std::mem::take(&mut ins.lagging) {
        let Some(node) = c.dns.get(dn) else { continue };
        let whole = node
            .valid_prefix(b.block_id, found)
            .is_ok_and(|n| n >= b.len);
        match whole.then(|| node.settle(b.block_id, found, b.gs, b.len)) {
            Some(Ok(())) => {
                tracing::info!(
                    block = b.block_id,
                    datanode = %dn,
                    gs = b.gs,
                    "lagging replica settled"
                );
                done.settled.push((dn, found));
                ins.good.push(dn);
            }
            _ => ins.bad.push((
                dn,
                ProblemKind::StaleReplica,
                format!(
                    "generation stamp {found} (expected {}) and not the recorded block",
                    b.gs
                ),
            )),
        }
    }
    if ins.good.is_empty() {
        // No replica at or behind the recorded stamp: replicas restamped
        // on disk by a change whose record was lost (versions before the
        // record came first could leave every replica so) are the block's
        // only copies, adopted if they hold it whole.
        for (dn, found) in std::mem::take(&mut ins.leading) {
            let Some(node) = c.dns.get(dn) else { continue };
            let whole = node
                .valid_prefix(b.block_id, found)
                .is_ok_and(|n| n >= b.len);
            if whole && node.settle(b.block_id, found, b.gs, b.len).is_ok() {
                tracing::warn!(
                    block = b.block_id,
                    datanode = %dn,
                    found,
                    gs = b.gs,
                    "replica with a stamp the metadata never recorded adopted"
                );
                ins.bad.retain(|(d, _, _)| *d != dn);
                done.settled.push((dn, found));
                ins.good.push(dn);
            }
        }
    }
    if ins.good.is_empty() && ins.dead.is_empty() {
        match cut_lost_tail(c, b, path) {
            Some(detail) => r.problems.push(Problem {
                kind: ProblemKind::MissingBlock,
                path: path.to_string(),
                block: Some(b.block_id),
                datanode: None,
                detail,
                repaired: true,
            }),
            None => report(b, path, &ins, false, want, None, r),
        }
        return;
    }
    if ins.good.is_empty() {
        // Its bytes may be on the dead datanodes: wait for them.
        report(b, path, &ins, false, want, None, r);
        return;
    }
    let mut row = b.clone();
    row.replicas = ins.good.clone();
    row.replicas.extend(&added);
    done.good_now = row.replicas.len();
    if row.replicas.len() < want {
        // Still short: the dead datanodes' copies stay recorded, for
        // when they come back.
        row.replicas.extend(&ins.dead);
    }
    done.dropped = ins.bad.iter().map(|(dn, _, _)| *dn).collect();
    if (row.replicas != b.replicas)
        && let Err(e) = c.meta.commit(&[Change::PutBlock(row.clone())], true)
    {
        tracing::error!(block = b.block_id, "cannot record repaired replicas: {e}");
        forget_copies(&added);
        report(b, path, &ins, false, want, None, r);
        return;
    }
    for dn in &done.dropped {
        if let Some(node) = c.dns.get(*dn)
            && c.dns.is_alive(*dn)
            && !row.replicas.contains(dn)
        {
            let _ = node.delete(b.block_id);
        }
    }
    ins.lagging = done.settled.clone();
    report(b, path, &ins, false, want, Some(&done), r);
}

/// A finalized block none of whose replicas holds it whole, yet some hold
/// a clean prefix of it (every chunk they have checks out): the tail of a
/// file that was never fsynced, lost to a power cut (its metadata was made
/// durable by another file's fsync, its replicas' last bytes were not).
/// The file is cut to what survives, durably, and the loss is logged.
/// Returns what was done, or `None` when some replica is corrupt inside
/// (damage, not a lost tail: left for the operator).
fn cut_lost_tail(c: &Check<'_>, b: &BlockRow, path: &str) -> Option<String> {
    let mut best: Option<u64> = None;
    let mut holders: Vec<(DnId, u64)> = Vec::new();
    for &dn in &b.replicas {
        let Some(node) = c.dns.get(dn) else { continue };
        let Some(info) = node.find(b.block_id) else {
            continue;
        };
        if info.gs > b.gs {
            continue;
        }
        match node.clean_prefix(b.block_id, info.gs) {
            Ok(Some(n)) => {
                best = Some(best.unwrap_or(0).max(n.min(b.len)));
                holders.push((dn, info.gs));
            }
            Ok(None) => return None,
            Err(_) => {}
        }
    }
    let keep = best.unwrap_or(0);
    let inode = c.meta.get(b.ino).ok()?;
    let start = b.idx * inode.block_size.max(1);
    let mut ch = vec![Change::DropBlocksFrom {
        ino: b.ino,
        from: if keep == 0 { b.idx } else { b.idx + 1 },
    }];
    let mut row = b.clone();
    if keep > 0 {
        row.len = keep;
        row.gs = c.meta.alloc("next_gs").ok()?;
        row.replicas = holders.iter().map(|(dn, _)| *dn).collect();
        ch.push(Change::PutBlock(row.clone()));
    }
    let end = start + keep;
    ch.push(Change::SetSize {
        ino: b.ino,
        size: end.min(inode.size),
        touch: None,
    });
    let gone = match c.meta.commit(&ch, true) {
        Ok(g) => g,
        Err(e) => {
            tracing::error!(block = b.block_id, "cannot cut a lost block: {e}");
            return None;
        }
    };
    // Recorded: now the replicas follow (those the block keeps cut and
    // restamped, the others deleted: they hold nothing it keeps).
    for &dn in &b.replicas {
        let Some(node) = c.dns.get(dn) else { continue };
        let r = match holders.iter().find(|(d, _)| *d == dn) {
            Some((_, found)) if keep > 0 => node.settle(b.block_id, *found, row.gs, keep),
            _ => node.delete(b.block_id),
        };
        if let Err(e) = r {
            tracing::warn!(block = b.block_id, datanode = %dn, "replica not cut: {e}");
        }
    }
    c.dns.delete_blocks(
        &gone
            .into_iter()
            .filter(|g| g.block_id != b.block_id)
            .collect::<Vec<_>>(),
    );
    let msg = format!(
        "no replica held the block's {} bytes (data never made durable, lost to a crash); the file now ends at byte {end} (was {})",
        b.len, inode.size
    );
    tracing::warn!(path, block = b.block_id, "{msg}");
    Some(msg)
}

fn list(ids: &[DnId]) -> String {
    ids.iter()
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Copies a finalized block from a good replica to live datanodes with
/// room that do not hold it until there are `want`; returns the datanodes
/// added.
pub fn replicate(dns: &Datanodes, b: &BlockRow, good: &[DnId], want: usize) -> Vec<DnId> {
    let mut added = Vec::new();
    let Some(src) = good.first().and_then(|d| dns.get(*d)) else {
        return added;
    };
    let need = want.saturating_sub(good.len());
    for dn in dns.choose_with_room(dns.len(), good, b.len.saturating_add(FULL_BELOW)) {
        if added.len() >= need {
            break;
        }
        let Some(dst) = dns.get(dn) else { continue };
        match dst.copy_replica_from(src, b.block_id, b.gs, b.len, ReplicaState::Finalized) {
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

/// Replica files no block needs: those of blocks no file has (always),
/// and, with [`Check::excess`], copies of a block on datanodes its row
/// does not list, once every replica the row lists is there. Nothing else
/// is ever deleted here, and only after the metadata that says so is
/// durable.
fn orphans(c: &Check<'_>, blocks: &[BlockRow], r: &mut Report) {
    if c.repair
        && let Err(e) = c.meta.sync_if_needed()
    {
        tracing::error!("orphan sweep skipped: the metadata cannot be made durable: {e}");
        return;
    }
    let known: HashMap<u64, &BlockRow> = blocks.iter().map(|b| (b.block_id, b)).collect();
    for node in c.dns.attached() {
        let i = node.id;
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
            // young rbw one may be about to be referenced.
            let young = (info.state == ReplicaState::Rbw || c.grace_finalized)
                && std::fs::metadata(&info.data_path)
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| SystemTime::now().duration_since(t).ok())
                    .is_some_and(|age| age < c.orphan_grace);
            if young {
                continue;
            }
            // The table read at the start may be older than this replica's
            // block (a file created during the run): look again first.
            let (kind, detail) = match c.meta.block_by_id(info.block) {
                Ok(None) => (ProblemKind::OrphanReplica, "replica of no file".to_string()),
                Ok(Some(row)) if !row.replicas.contains(&i) && c.excess && is_whole(c, &row) => (
                    ProblemKind::ExcessReplica,
                    format!(
                        "copy of a block whose {} recorded replicas are all there (generation stamp {}, the block's is {})",
                        row.replicas.len(),
                        info.gs,
                        row.gs
                    ),
                ),
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
                p.repaired = node.delete(info.block).is_ok();
            }
            r.problems.push(p);
        }
    }
}

/// Whether a finalized block has at least the replication factor of
/// replicas recorded, each on a live datanode at the block's generation
/// stamp and length: then no other copy of it is needed.
fn is_whole(c: &Check<'_>, row: &BlockRow) -> bool {
    row.finalized
        && row.replicas.len() >= c.dns.replication
        && row.replicas.iter().all(|&dn| {
            c.dns.is_alive(dn)
                && c.dns.get(dn).is_some_and(|n| {
                    matches!(n.stat_replica(row.block_id, row.gs), Ok((ReplicaState::Finalized, len)) if len == row.len)
                })
        })
}
