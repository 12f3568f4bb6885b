//! leasefs' own housekeeping, structured as leader-only tasks: only the
//! daemon that holds housekeeping leadership runs them (with one daemon
//! per namespace, that daemon; with several, the elected one), and each
//! take/lose of leadership is logged as an event.
//!
//! Tasks: re-replication of under-replicated or corrupt finalized blocks
//! (also the copying of decommissioning datanodes' blocks, and marking a
//! datanode decommissioned once every block it holds is held R times by
//! datanodes in service), recovery of files left under construction with
//! no live lease, and removal of replica files that no file references
//! (after a grace period). Lease expiry itself stays with each daemon's
//! lease monitor, because the embedded lease manager is local to its
//! daemon. One task runs on every daemon, leader or not: the orphan sweep
//! of its own host's copies (`-o local_copy`), which a leader on another
//! host cannot reach.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use crate::fs::Core;
use crate::fsck::{self, Check, Report};
use crate::meta::{AdminState, AuditEvent, AuditLog};
use crate::sync::{Arc, AtomicBool, Condvar, Mutex, Ordering, lock};

/// How soon the next round follows one that copied blocks of a
/// decommissioning datanode, or a change of admin states: decommissioning
/// goes on without waiting for `housekeeping_interval`.
const HURRY: Duration = Duration::from_secs(1);

pub struct Housekeeper {
    leader: AtomicBool,
    /// Set by [`Housekeeper::kick`]: run a round now.
    kicked: Mutex<bool>,
    wake: Condvar,
}

impl Default for Housekeeper {
    fn default() -> Self {
        Self::new()
    }
}

impl Housekeeper {
    pub fn new() -> Self {
        Housekeeper {
            leader: AtomicBool::new(false),
            kicked: Mutex::new(false),
            wake: Condvar::new(),
        }
    }

    /// Asks for a round now (a decommission was started here).
    pub fn kick(&self) {
        *lock(&self.kicked) = true;
        self.wake.notify_all();
    }

    /// Runs rounds until `stop`: every `interval`, at once when kicked or
    /// when this daemon's view of the admin states changed (another
    /// daemon started a decommission), and every [`HURRY`] while a
    /// decommission is making progress.
    pub fn run(&self, core: &Arc<Core>, interval: Duration, stop: &AtomicBool) {
        let mut last = Instant::now();
        let mut seen = admin_view(core);
        // A decommission under way when the daemon (re)started resumes at
        // once.
        let mut hurry = seen.iter().any(|(_, a)| *a == AdminState::Decommissioning);
        while !stop.load(Ordering::Relaxed) {
            let kicked = {
                let g = lock(&self.kicked);
                let (mut g, _) = self
                    .wake
                    .wait_timeout_while(g, HURRY, |k| !*k)
                    .unwrap_or_else(|e| e.into_inner());
                std::mem::take(&mut *g)
            };
            let view = admin_view(core);
            let changed = view != seen;
            seen = view;
            let due = last.elapsed() >= interval || (hurry && last.elapsed() >= HURRY);
            if stop.load(Ordering::Relaxed) || !(kicked || changed || due) {
                continue;
            }
            crate::fault::panic_if("housekeeping", || {
                core.meta()
                    .lookup(crate::meta::ROOT_INO, crate::fault::TRIGGER.as_bytes())
                    .is_ok()
            });
            hurry = self.round(core);
            last = Instant::now();
        }
    }

    pub fn is_leader(&self) -> bool {
        self.leader.load(Ordering::Relaxed)
    }

    /// takeLeadership: tasks run from the next round on. The event goes to
    /// the election audit table (election `housekeeping`) with the log.
    pub fn take(&self, log: &dyn AuditLog, why: &str) {
        if !self.leader.swap(true, Ordering::Relaxed) {
            tracing::info!(event = "take", "housekeeping leadership taken: {why}");
            audit(log, "elected", why);
        }
    }

    /// loseLeadership: tasks stop before the next round.
    pub fn lose(&self, log: &dyn AuditLog, why: &str) {
        if self.leader.swap(false, Ordering::Relaxed) {
            tracing::warn!(event = "lose", "housekeeping leadership lost: {why}");
            audit(log, "lost", why);
        }
    }

    /// One round of every task, if this daemon leads (else the sweep of
    /// this host's copies alone). Returns whether a decommission made
    /// progress (the next round should follow soon).
    pub fn round(&self, core: &Arc<Core>) -> bool {
        if !self.is_leader() {
            sweep_copies(core);
            return false;
        }
        let recover = |ino| core.recover(ino, crate::lease::RecoveryReason::HolderGone);
        let pin = |ino| core.pin(ino);
        let Some(mut c) = repairs(core, &pin, &recover) else {
            return false;
        };
        c.suspect = core.bad().list().into_iter().collect();
        // Quarantined replicas past their retention (leader only: one
        // daemon removes them).
        expire_quarantines(&core.dns().attached());
        match fsck::run(&c) {
            Ok(r) => {
                for p in r.problems.iter().filter(|p| p.repaired) {
                    tracing::info!(kind = ?p.kind, path = %p.path, block = ?p.block, "housekeeping repaired: {}", p.detail);
                }
                // Checked, unless under a writer (not repaired then): those
                // stay suspect for a later round.
                for &(b, dn) in c.suspect.iter().filter(|(b, _)| !c.busy_blocks.contains(b)) {
                    core.bad().clear(b, dn);
                }
                core.advance_flush_marks();
                finish_decommissions(core, &r)
            }
            Err(e) => {
                tracing::error!("housekeeping round failed: {e}");
                false
            }
        }
    }
}

/// The orphan sweep of this host's copies, on a daemon that does not lead
/// housekeeping (the leader's own sweep covers its attached datanodes,
/// its host's copies among them): replica files no block needs, with the
/// leader's rules (grace, blocks in flight, durable metadata first).
fn sweep_copies(core: &Arc<Core>) {
    let copies = core.dns().copies_here();
    if copies.is_empty() {
        return;
    }
    let pin = |ino| core.pin(ino);
    let not_leader = |_| {
        Err(crate::error::FsError::NotPermitted(
            "not the housekeeping leader",
        ))
    };
    let Some(mut c) = repairs(core, &pin, &not_leader) else {
        return;
    };
    // Copies exist only over a shared namespace; a daemon that does not
    // lead copies no block.
    c.shared = true;
    c.copy = false;
    expire_quarantines(&copies);
    match fsck::sweep_copies(&c) {
        Ok(r) => {
            for p in r.problems.iter().filter(|p| p.repaired) {
                tracing::info!(kind = ?p.kind, path = %p.path, block = ?p.block, "host copy swept: {}", p.detail);
            }
        }
        Err(e) => tracing::warn!("sweep of this host's copies failed: {e}"),
    }
}

/// The check of a housekeeping round (the leader's, and each daemon's
/// sweep of its host's copies): repairs with the conservative rules of
/// automatic housekeeping (the orphan grace for every replica, excess
/// copies too, checksums read only for suspect replicas), copying blocks
/// short of R, shared when the namespace is, never under a writer.
/// `None` when the files being written cannot be known now (then nothing
/// may be repaired).
fn repairs<'a>(
    core: &'a Core,
    pin: &'a dyn Fn(u64) -> Option<fsck::Pinned<'a>>,
    recover: &'a dyn Fn(u64) -> crate::error::FsResult<u64>,
) -> Option<Check<'a>> {
    let live = core.live_files()?;
    let busy = core.busy_blocks(&live);
    Some(Check {
        meta: &**core.meta(),
        dns: core.dns(),
        repair: true,
        live_leases: live,
        busy_blocks: busy,
        progress: false,
        deep: false,
        suspect: HashSet::new(),
        orphans: true,
        excess: true,
        orphan_grace: fsck::ORPHAN_GRACE,
        grace_finalized: true,
        shared: core.cluster.is_some(),
        copy: true,
        pin,
        recover,
        cancelled: &fsck::never_cancelled,
    })
}

/// Each datanode's admin state as this daemon sees it.
fn admin_view(core: &Core) -> Vec<(crate::meta::DnId, AdminState)> {
    core.dns()
        .statuses()
        .into_iter()
        .map(|d| (d.id, d.admin))
        .collect()
}

/// Marks decommissioned every decommissioning datanode none of whose
/// blocks is still short of R replicas in service (the round just looked
/// at every block). Returns whether any decommission is still copying and
/// this round copied something for it.
fn finish_decommissions(core: &Core, r: &Report) -> bool {
    let copied = r
        .problems
        .iter()
        .any(|p| p.repaired && p.kind == fsck::ProblemKind::DecommissionPending);
    let mut busy = false;
    for d in &r.decommissioning {
        if d.pending > 0 {
            busy = true;
            continue;
        }
        match core.meta().set_datanode_state(
            d.datanode,
            &[AdminState::Decommissioning],
            AdminState::Decommissioned,
        ) {
            Ok(AdminState::Decommissioning) => {
                core.dns().set_admin(d.datanode, AdminState::Decommissioned);
                tracing::info!(
                    datanode = %d.datanode,
                    blocks = d.blocks,
                    "datanode decommissioned: every block it holds is held R times by datanodes in service; safe to remove"
                );
            }
            Ok(other) => core.dns().set_admin(d.datanode, other),
            Err(e) => {
                tracing::warn!(datanode = %d.datanode, "cannot record the end of a decommission: {e}")
            }
        }
    }
    busy && copied
}

/// The name housekeeping's leadership is recorded under in the audit table.
pub const ELECTION: &str = "housekeeping";

fn audit(log: &dyn AuditLog, event: &str, why: &str) {
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_default();
    let e = AuditEvent {
        election: ELECTION.into(),
        event: event.into(),
        who: format!("daemon {}", std::process::id()),
        host,
        pid: std::process::id(),
        epoch: 0,
        at_ms: crate::clock::wall_ms(),
        why: why.into(),
    };
    // The daemon's own events count as root's.
    if let Err(err) = log.audit(&e, 0) {
        tracing::warn!("cannot record housekeeping {event}: {err}");
    }
}

/// Removes the quarantined replicas of `nodes` past their retention.
fn expire_quarantines(nodes: &[Arc<dyn crate::storage::Storage>]) {
    for node in nodes {
        if let Err(e) = node.expire_quarantine(crate::storage::quarantine::RETENTION) {
            tracing::warn!(datanode = %node.id(), "cannot expire the quarantine: {e}");
        }
    }
}
