//! One block's check and repair: its replicas inspected (good, bad,
//! lagging or leading the recorded generation stamp, on dead datanodes),
//! and, with repair, the block made whole under a pin that keeps writers
//! off its file: lagging replicas settled, bad ones replaced by copies,
//! and a block no replica holds whole cut back to what survives.
//! Host-local copies (`-o local_copy`) count toward nothing: they are
//! neither counted, nor reported, nor replaced, and a repair keeps them
//! in the row; this host's good ones may be the source of a repair.

use super::{Check, Problem, ProblemKind, Report, replicate};
use crate::meta::{BlockRow, Change, Counter, DnId};
use crate::pipeline::copies::Role;
use crate::pipeline::datanodes::Health;
use crate::storage::StorageError;

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
    /// Replicas on host-local copies (this host's or another's): kept as
    /// they are, whatever their state.
    copies: Vec<DnId>,
    /// Of those, this host's that hold the block whole: a source for a
    /// repair when no shared replica is good.
    copy_sources: Vec<DnId>,
}

fn inspect(c: &Check<'_>, b: &BlockRow) -> Inspection {
    let mut ins = Inspection::default();
    for &dn in &b.replicas {
        // A removed datanode's entry means nothing (see DatanodeRegistry::remove_datanode).
        if !c.dns.is_recorded(dn) {
            continue;
        }
        if c.dns.is_copy(dn) {
            ins.copies.push(dn);
            if c.dns.role(dn) == Role::Here && copy_is_whole(c, b, dn) {
                ins.copy_sources.push(dn);
            }
            continue;
        }
        if c.dns.health(dn) == Health::Dead {
            ins.dead.push(dn);
            continue;
        }
        let Some(node) = c.dns.get(dn) else {
            ins.dead.push(dn);
            continue;
        };
        let data_len = match node.stat_replica(b.block_id, b.gs) {
            Ok(st) => st.data_len,
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

/// Whether this host's copy `dn` of `b` is readable at the block's stamp
/// (and, finalized, its length; verified when deep or suspect).
fn copy_is_whole(c: &Check<'_>, b: &BlockRow, dn: DnId) -> bool {
    let Some(node) = c.dns.get(dn).filter(|_| c.dns.is_alive(dn)) else {
        return false;
    };
    match node.stat_replica(b.block_id, b.gs) {
        Ok(st) if !b.finalized => st.data_len > 0 || b.len == 0,
        Ok(st) if st.data_len != b.len => false,
        Ok(_) if c.deep || c.suspect.contains(&(b.block_id, dn)) => node
            .valid_prefix(b.block_id, b.gs)
            .is_ok_and(|n| n >= b.len),
        Ok(_) => true,
        Err(_) => false,
    }
}

/// Checks (and with repair, fixes) one block; returns how many good
/// replicas it has on datanodes in service afterwards (decommissioning and
/// decommissioned datanodes serve reads and are sources for copies, but
/// only datanodes in service count toward R).
pub(super) fn check_block(c: &Check<'_>, b: &BlockRow, path: &str, r: &mut Report) -> usize {
    let recorded = b.replicas.iter().filter(|d| c.dns.is_recorded(**d)).count();
    r.replicas += recorded as u64;
    let ins = inspect(c, b);
    let want = c.dns.replication;
    let serving = in_service(c, &ins.good);
    let healthy = ins.bad.is_empty()
        && ins.lagging.is_empty()
        && serving >= want
        && recorded == b.replicas.len();
    let repairable = c.repair && b.finalized && !c.busy_blocks.contains(&b.block_id);
    if healthy || !repairable {
        // A block being written (or left open) is settled by recovery:
        // its lagging replicas are members, not problems.
        let lagging_ok = !b.finalized;
        report(c, b, path, &ins, lagging_ok, None, r);
        return serving;
    }
    repair_block(c, b, path, ins, r)
}

/// How many of `good` are on datanodes in service.
fn in_service(c: &Check<'_>, good: &[DnId]) -> usize {
    good.iter()
        .filter(|d| c.dns.admin(**d).in_service())
        .count()
}

/// Records the problems of an inspection; `fixed` says what a repair did
/// (`None`: nothing was repaired). `lagging_ok`: lagging replicas are
/// members in good standing (a block being written or left open, which
/// recovery settles).
fn report(
    c: &Check<'_>,
    b: &BlockRow,
    path: &str,
    ins: &Inspection,
    lagging_ok: bool,
    fixed: Option<&Repaired>,
    r: &mut Report,
) {
    let want = c.dns.replication;
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
    let lagging = if lagging_ok { ins.lagging.len() } else { 0 };
    let usable = ins.good.len() + lagging;
    // This host's good copy keeps the block from being missing (a repair
    // copies it back), never makes it count.
    let readable = usable + ins.copy_sources.len();
    let serving = in_service(c, &ins.good) + lagging;
    let retiring: Vec<DnId> = ins
        .good
        .iter()
        .copied()
        .filter(|d| !c.dns.admin(*d).in_service())
        .collect();
    let have = fixed.map_or(serving, |f| f.good_now);
    if readable > 0 && have < want {
        r.under_replicated += 1;
        r.under_replicated_bytes += b.len;
    }
    if readable == 0 {
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
    } else if serving < want {
        // Readable R times counting decommissioning datanodes: the
        // decommission is still copying it, nothing is less safe.
        let kind = if usable >= want {
            ProblemKind::DecommissionPending
        } else {
            ProblemKind::UnderReplicated
        };
        let mut detail = format!("{serving} of {want} replicas on datanodes in service");
        if !retiring.is_empty() {
            detail.push_str(&format!(
                " (more on decommissioning datanodes: {})",
                list(&retiring)
            ));
        }
        if !ins.dead.is_empty() {
            detail.push_str(&format!(" (on dead datanodes: {})", list(&ins.dead)));
        }
        let mut p = problem(
            kind,
            None,
            detail,
            fixed.is_some_and(|f| f.good_now >= want),
        );
        if let Some(h) = fixed.map(|f| f.good_now).filter(|h| *h < want) {
            p.detail.push_str(&format!(
                "; only {h} datanodes in service could take a copy"
            ));
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
    /// Good replicas on datanodes in service the block has now.
    good_now: usize,
}

/// Repairs one finalized block: lagging replicas settled, missing or bad
/// ones replaced by copies of a good one, and a block no replica holds
/// whole cut back to what survives (a never-synced tail a power cut took).
/// With the file kept from writers and the block still as inspected,
/// copies are made, and the repair is recorded, durably, before any bad
/// replica is deleted.
/// Returns the good replicas on datanodes in service afterwards.
fn repair_block(
    c: &Check<'_>,
    b: &BlockRow,
    path: &str,
    mut ins: Inspection,
    r: &mut Report,
) -> usize {
    let want = c.dns.replication;
    let serving = in_service(c, &ins.good);
    let forget_copies = |added: &[DnId]| {
        for dn in added {
            if let Some(node) = c.dns.get(*dn) {
                let _ = node.delete_recorded(b.block_id, b.gs);
            }
        }
    };
    // The pin comes before any copy: a copy replaces whatever files of the
    // block its destination holds, and a writer that reopened the file
    // since the inspection has its live replicas there (a power-cut round
    // lost fsynced appends so when copies were made first).
    let Some(_pin) = (c.pin)(b.ino) else {
        // A writer has the file now: the next round looks again.
        report(c, b, path, &ins, false, None, r);
        return serving;
    };
    let current = c
        .meta
        .blocks(b.ino)
        .ok()
        .and_then(|rows| rows.into_iter().find(|x| x.block_id == b.block_id));
    if current.as_ref() != Some(b) {
        // Changed since the check read it (written, truncated, removed).
        return serving;
    }
    let mut added = Vec::new();
    // Copies exist before the commit below lists them.
    let _hold = c.dns.hold(b.block_id);
    // Good shared replicas first; this host's copy when none is left.
    let sources: Vec<DnId> = ins.good.iter().chain(&ins.copy_sources).copied().collect();
    if c.copy && b.finalized && !sources.is_empty() && serving < want {
        added = replicate(c.dns, b, &sources, want - serving);
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
            // What lies past the recorded length was written under a stamp
            // the metadata never recorded (or forgot: a restored meta.db):
            // a copy goes to the quarantine before the cut.
            let longer = node
                .stat_replica(b.block_id, found)
                .is_ok_and(|st| st.data_len > b.len);
            let kept = !longer
                || node.keep_copy(b.block_id, found).inspect_err(|e| {
                    tracing::error!(block = b.block_id, datanode = %dn, "replica not adopted: no copy could be kept: {e}")
                }).is_ok();
            if whole && kept && node.settle(b.block_id, found, b.gs, b.len).is_ok() {
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
    // Cut only a block whose replicas were on datanodes still recorded (a
    // power cut took their bytes); one whose datanodes were all removed
    // by the operator stays missing, for fsck to name.
    let on_recorded = b.replicas.iter().any(|d| c.dns.is_recorded(*d));
    if ins.good.is_empty() && !added.is_empty() {
        // Copied back from this host's copy: the copies are the block's
        // shared replicas now.
        ins.good.clone_from(&added);
        added.clear();
    }
    if ins.good.is_empty() && ins.dead.is_empty() && on_recorded {
        match cut_lost_tail(c, b, path) {
            Some(detail) => r.problems.push(Problem {
                kind: ProblemKind::MissingBlock,
                path: path.to_string(),
                block: Some(b.block_id),
                datanode: None,
                detail,
                repaired: true,
            }),
            None => report(c, b, path, &ins, false, None, r),
        }
        return 0;
    }
    if ins.good.is_empty() {
        // Its bytes may be on the dead datanodes: wait for them (or its
        // datanodes were removed: it is lost, and reported so).
        report(c, b, path, &ins, false, None, r);
        return 0;
    }
    let mut row = b.clone();
    row.replicas = ins.good.clone();
    row.replicas.extend(&added);
    // Host copies stay as they are: counted nowhere, each its host's.
    row.replicas.extend(&ins.copies);
    done.good_now = in_service(c, &ins.good) + added.len();
    if done.good_now < want {
        // Still short: the dead datanodes' copies stay recorded, for
        // when they come back.
        row.replicas.extend(&ins.dead);
    }
    done.dropped = ins.bad.iter().map(|(dn, _, _)| *dn).collect();
    // Compare-and-set: a balancer, a removal or another daemon may have
    // changed the row since (the pin keeps only this daemon's writers off).
    let change = Change::PutBlockIf {
        expect: b.clone(),
        row: row.clone(),
    };
    if (row.replicas != b.replicas)
        && let Err(e) = c.meta.commit(&[change], true)
    {
        match e {
            crate::error::FsError::Moved(why) => {
                tracing::debug!(block = b.block_id, "repair not recorded: {why}")
            }
            e => tracing::error!(block = b.block_id, "cannot record repaired replicas: {e}"),
        }
        forget_copies(&added);
        report(c, b, path, &ins, false, None, r);
        return serving;
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
    let now = done.good_now;
    report(c, b, path, &ins, false, Some(&done), r);
    now
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
        row.gs = c.meta.alloc(Counter::GenStamp).ok()?;
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
    let msg = if keep == b.len {
        // Nothing lost: the replicas were longer than the block (zeros
        // filled ahead of a writer, whose cut a crash kept from the disk).
        format!(
            "the replicas held the block's {} bytes and more (zeros filled ahead of a writer, not yet cut when the daemon or the power went); cut back to the block",
            b.len
        )
    } else {
        format!(
            "no replica held the block's {} bytes (data never made durable, lost to a crash); the file now ends at byte {end} (was {})",
            b.len, inode.size
        )
    };
    tracing::warn!(path, block = b.block_id, "{msg}");
    Some(msg)
}

pub(super) fn list(ids: &[DnId]) -> String {
    ids.iter()
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}
