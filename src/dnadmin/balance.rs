//! The balancer (`leasefs datanode balance`), after HDFS's: it moves
//! replicas of finished blocks from the most used datanode in service to
//! the least used one until their used fractions (bytes of replicas the
//! metadata records there, over the size of the datanode's filesystem)
//! differ by at most the threshold, in percentage points. A move copies
//! first, records the new replica list in place of the old one (a
//! compare-and-set, so a concurrent repair or writer wins), makes that
//! durable, and only then deletes the old copy: a block never has fewer
//! than R good replicas during a move. Blocks being written, and blocks
//! that are not whole (fewer than R good replicas in service), are left
//! alone.

use std::collections::{BTreeMap, HashSet};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::capacity;
use crate::error::FsError;
use crate::fs::Core;
use crate::fsck::is_whole;
use crate::meta::{BlockRow, Change, DnId};
use crate::pipeline::Health;
use crate::pipeline::datanodes::FULL_BELOW;
use crate::storage::ReplicaState;
use crate::sync::{Arc, Mutex, lock};

/// What the balancer is doing or did.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Status {
    pub running: bool,
    pub threshold_pct: f64,
    pub moved_blocks: u64,
    pub moved_bytes: u64,
    /// Largest minus smallest used fraction among datanodes in service,
    /// in percentage points, as last measured.
    pub spread_pct: f64,
    /// How it ended (or why it cannot go on).
    pub outcome: Option<String>,
    pub elapsed_ms: u64,
}

pub struct Job {
    status: Mutex<Status>,
}

impl Job {
    /// Starts balancing on a thread of its own.
    pub fn start(core: Arc<Core>, threshold_pct: f64) -> Arc<Job> {
        let job = Arc::new(Job {
            status: Mutex::new(Status {
                running: true,
                threshold_pct,
                ..Status::default()
            }),
        });
        let j = job.clone();
        let r = std::thread::Builder::new()
            .name("balancer".into())
            .spawn(move || {
                let t0 = Instant::now();
                let outcome = run(&core, &j, threshold_pct);
                tracing::info!("balancer: {outcome}");
                let mut s = lock(&j.status);
                s.running = false;
                s.outcome = Some(outcome);
                s.elapsed_ms = t0.elapsed().as_millis() as u64;
            });
        if let Err(e) = r {
            let mut s = lock(&job.status);
            s.running = false;
            s.outcome = Some(format!("cannot start the balancer: {e}"));
        }
        job
    }

    pub fn running(&self) -> bool {
        lock(&self.status).running
    }

    pub fn status(&self) -> Status {
        lock(&self.status).clone()
    }
}

/// A datanode the balancer may move replicas from or to.
struct Node {
    id: DnId,
    used: u64,
    capacity: u64,
    free: u64,
}

impl Node {
    fn util(&self) -> f64 {
        self.used as f64 / self.capacity as f64
    }
}

/// Passes over the block table until the spread is within the threshold or
/// a pass moves nothing; returns how it ended.
fn run(core: &Core, job: &Job, threshold_pct: f64) -> String {
    let threshold = threshold_pct / 100.0;
    loop {
        let (mut nodes, blocks) = match survey(core) {
            Ok(v) => v,
            Err(e) => return format!("stopped: {e}"),
        };
        if nodes.len() < 2 {
            return "nothing to balance: fewer than two live datanodes in service".into();
        }
        let spread = spread_of(&nodes);
        lock(&job.status).spread_pct = spread * 100.0;
        if spread <= threshold {
            return format!(
                "balanced: used fractions within {:.1} points (threshold {threshold_pct})",
                spread * 100.0
            );
        }
        let busy = match core.live_files() {
            Some(live) => core.busy_blocks(&live),
            None => return "stopped: cannot tell which files are being written".into(),
        };
        let mut moved = 0;
        // Blocks by datanode, largest first: few moves close a gap.
        let mut on: BTreeMap<DnId, Vec<&BlockRow>> = BTreeMap::new();
        for b in blocks
            .iter()
            .filter(|b| b.finalized && !busy.contains(&b.block_id))
        {
            for dn in &b.replicas {
                on.entry(*dn).or_default().push(b);
            }
        }
        for v in on.values_mut() {
            v.sort_by_key(|b| std::cmp::Reverse(b.len));
        }
        let mut tried: HashSet<u64> = HashSet::new();
        while let Some((src, dst)) = pair(&nodes, threshold) {
            let gap = nodes[src].util() - nodes[dst].util();
            let cand = on.get(&nodes[src].id).and_then(|v| {
                v.iter().copied().find(|b| {
                    !tried.contains(&b.block_id)
                        && !b.replicas.contains(&nodes[dst].id)
                        && nodes[dst].free >= b.len.saturating_add(FULL_BELOW)
                        && after(&nodes[src], &nodes[dst], b.len) < gap
                })
            });
            let Some(b) = cand else {
                // Nothing on the most used datanode narrows this gap: take
                // it out of this pass.
                nodes.remove(src);
                continue;
            };
            tried.insert(b.block_id);
            match move_replica(core, b, nodes[src].id, nodes[dst].id) {
                Ok(true) => {
                    moved += 1;
                    nodes[src].used -= b.len;
                    nodes[dst].used += b.len;
                    nodes[dst].free = nodes[dst].free.saturating_sub(b.len);
                    let mut s = lock(&job.status);
                    s.moved_blocks += 1;
                    s.moved_bytes += b.len;
                    s.spread_pct = spread_of(&nodes) * 100.0;
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(block = b.block_id, "balancer: move failed: {e}");
                }
            }
        }
        if moved == 0 {
            return format!(
                "stopped: no block can be moved to narrow the spread of {:.1} points further",
                spread * 100.0
            );
        }
    }
}

/// The live datanodes in service and the block table.
fn survey(core: &Core) -> Result<(Vec<Node>, Vec<BlockRow>), FsError> {
    let blocks = core.meta().all_blocks()?;
    let mut used: BTreeMap<DnId, u64> = BTreeMap::new();
    for b in &blocks {
        for dn in &b.replicas {
            *used.entry(*dn).or_default() += b.len;
        }
    }
    let nodes = core
        .dns()
        .statuses()
        .into_iter()
        // Shared datanodes only: a host's copies are placed with their
        // blocks and never moved.
        .filter(|d| d.state == Health::Live && d.admin.in_service() && d.host.is_none())
        .filter_map(|d| {
            let node = core.dns().get(d.id)?;
            let capacity = capacity(node.root()).filter(|c| *c > 0)?;
            Some(Node {
                id: d.id,
                used: used.get(&d.id).copied().unwrap_or(0),
                capacity,
                free: d.free_bytes.unwrap_or(0),
            })
        })
        .collect();
    Ok((nodes, blocks))
}

fn spread_of(nodes: &[Node]) -> f64 {
    let (lo, hi) = nodes.iter().fold((f64::MAX, f64::MIN), |(lo, hi), n| {
        (lo.min(n.util()), hi.max(n.util()))
    });
    if nodes.len() < 2 { 0.0 } else { hi - lo }
}

/// The most and the least used datanodes, if they differ by more than
/// `threshold`.
fn pair(nodes: &[Node], threshold: f64) -> Option<(usize, usize)> {
    let by = |a: &(usize, &Node), b: &(usize, &Node)| a.1.util().total_cmp(&b.1.util());
    let (hi, h) = nodes.iter().enumerate().max_by(by)?;
    let (lo, l) = nodes.iter().enumerate().min_by(by)?;
    (h.util() - l.util() > threshold).then_some((hi, lo))
}

/// The gap between `src` and `dst` once `len` bytes moved from one to the
/// other (absolute: a move too large overshoots).
fn after(src: &Node, dst: &Node, len: u64) -> f64 {
    let s = (src.used - len) as f64 / src.capacity as f64;
    let d = (dst.used + len) as f64 / dst.capacity as f64;
    (s - d).abs()
}

/// Moves the replica of `b` on `from` to `to`: copy, record (durably), then
/// delete the old copy once the recorded list is whole without it.
/// Returns false when the block changed meanwhile (nothing is deleted
/// then; an unlisted copy is left to the orphan sweep).
fn move_replica(core: &Core, b: &BlockRow, from: DnId, to: DnId) -> Result<bool, FsError> {
    let dns = core.dns();
    // Only blocks that are whole now: a move never makes anything less
    // safe than it was.
    let Some(now) = core.meta().block_by_id(b.block_id)? else {
        return Ok(false);
    };
    if now != *b || !is_whole(dns, b) {
        return Ok(false);
    }
    let (Some(src), Some(dst)) = (dns.get(from), dns.get(to)) else {
        return Ok(false);
    };
    // The copy is excess to every sweep until the commit below lists it.
    let _hold = dns.hold(b.block_id);
    if let Err(e) = dst.copy_replica_from(&*src, b.block_id, b.gs, b.len, ReplicaState::Finalized) {
        dns.mark_failed(to, &e);
        return Err(e.into());
    }
    let mut row = b.clone();
    for d in row.replicas.iter_mut() {
        if *d == from {
            *d = to;
        }
    }
    let change = Change::PutBlockIf {
        expect: b.clone(),
        row: row.clone(),
    };
    match core.meta().commit(&[change], true) {
        Ok(_) => {}
        Err(FsError::Moved(_)) => return Ok(false),
        Err(e) => return Err(e),
    }
    // The durable row no longer lists `from`; delete its copy only if the
    // block is still whole without it.
    match core.meta().block_by_id(b.block_id)? {
        Some(r) if !r.replicas.contains(&from) && is_whole(dns, &r) => {
            src.delete_recorded(b.block_id, b.gs)?;
            tracing::info!(block = b.block_id, from = %from, to = %to, "balancer moved a replica");
        }
        _ => {}
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(id: u32, used: u64, capacity: u64) -> Node {
        Node {
            id: DnId(id),
            used,
            capacity,
            free: capacity - used,
        }
    }

    #[test]
    fn the_pair_is_the_most_and_least_used_beyond_the_threshold() {
        let nodes = vec![n(0, 50, 100), n(1, 10, 100), n(2, 30, 100)];
        assert_eq!(pair(&nodes, 0.1), Some((0, 1)));
        assert!((spread_of(&nodes) - 0.4).abs() < 1e-9);
        assert_eq!(pair(&nodes, 0.4), None);
        // A move of 20 closes the gap exactly; one of 45 overshoots it.
        assert!(after(&nodes[0], &nodes[1], 20) < 1e-9);
        assert!(after(&nodes[0], &nodes[1], 45) > 0.4);
    }
}
