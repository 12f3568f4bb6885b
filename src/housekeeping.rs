//! leasefs' own housekeeping, structured as leader-only tasks: only the
//! daemon that holds housekeeping leadership runs them (with one daemon
//! per namespace, that daemon; with several, the elected one), and each
//! take/lose of leadership is logged as an event.
//!
//! Tasks: re-replication of under-replicated or corrupt finalized blocks,
//! recovery of files left under construction with no live lease, and
//! removal of replica files that no file references (after a grace period).
//! Lease expiry itself stays with each daemon's lease monitor, because the
//! embedded lease manager is local to its daemon.

use std::collections::HashSet;

use crate::fs::Core;
use crate::fsck::{self, Check};
use crate::meta::{AuditEvent, Meta};
use crate::sync::{Arc, AtomicBool, Ordering};

pub struct Housekeeper {
    leader: AtomicBool,
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
        }
    }

    pub fn is_leader(&self) -> bool {
        self.leader.load(Ordering::Relaxed)
    }

    /// takeLeadership: tasks run from the next round on. The event goes to
    /// the election audit table (election `housekeeping`) with the log.
    pub fn take(&self, meta: &dyn Meta, why: &str) {
        if !self.leader.swap(true, Ordering::Relaxed) {
            tracing::info!(event = "take", "housekeeping leadership taken: {why}");
            audit(meta, "elected", why);
        }
    }

    /// loseLeadership: tasks stop before the next round.
    pub fn lose(&self, meta: &dyn Meta, why: &str) {
        if self.leader.swap(false, Ordering::Relaxed) {
            tracing::warn!(event = "lose", "housekeeping leadership lost: {why}");
            audit(meta, "lost", why);
        }
    }

    /// One round of every task, if this daemon leads.
    pub fn round(&self, core: &Arc<Core>) {
        if !self.is_leader() {
            return;
        }
        let Some(live) = core.live_files() else {
            return;
        };
        let busy = core.busy_blocks(&live);
        let suspect: HashSet<(u64, crate::meta::DnId)> = core.bad.list().into_iter().collect();
        let c = Check {
            meta: &*core.meta,
            dns: &core.dns,
            repair: true,
            live_leases: live,
            busy_blocks: busy,
            progress: false,
            deep: false,
            suspect: suspect.clone(),
            orphans: true,
            excess: true,
            orphan_grace: fsck::ORPHAN_GRACE,
            grace_finalized: true,
            pin: &|ino| core.pin(ino),
            recover: &|ino| core.recover(ino, crate::lease::RecoveryReason::HolderGone),
        };
        match fsck::run(&c) {
            Ok(r) => {
                for p in r.problems.iter().filter(|p| p.repaired) {
                    tracing::info!(kind = ?p.kind, path = %p.path, block = ?p.block, "housekeeping repaired: {}", p.detail);
                }
                for (b, dn) in suspect {
                    core.bad.clear(b, dn);
                }
            }
            Err(e) => tracing::error!("housekeeping round failed: {e}"),
        }
    }
}

/// The name housekeeping's leadership is recorded under in the audit table.
pub const ELECTION: &str = "housekeeping";

fn audit(meta: &dyn Meta, event: &str, why: &str) {
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
    if let Err(err) = meta.audit(&e) {
        tracing::warn!("cannot record housekeeping {event}: {err}");
    }
}
