//! The cluster side of [`Core`] (several daemons over etcd): claiming a
//! file before its lease is granted here, giving claims up, losing them,
//! and recovering files that another daemon left under construction.

use std::time::{Duration, Instant};

use super::core::{Caller, Core};
use super::file_record::FileRecord;
use super::proc_info;
use crate::error::{FsError, FsResult};
use crate::lease::cluster::{Claim, ClaimInfo, Cluster, Turn};
use crate::lease::{LeaseError, RecoveryReason};
use crate::meta::UnderConstruction;
use crate::sync::Arc;

/// How often the head of a file's queue across daemons (`lease_wait`)
/// tries to claim the file (the others look four times less often).
const CLAIM_RETRY: Duration = Duration::from_millis(25);

/// How long the head of a file's queue may leave the file unclaimed before
/// the writers behind it go first: a head that does not claim a free file
/// within this (it looks every [`CLAIM_RETRY`]) belongs to a daemon that
/// died; its key lasts until that daemon's liveness lease runs out.
const STALE_HEAD: Duration = Duration::from_secs(1);

impl Core {
    /// Claims `ino` for handle `fh`, in turn: while writers of any daemon
    /// queue for the file, only the first may claim it. With `lease_wait`
    /// (and no `O_NONBLOCK`) the open joins that queue and waits, FIFO
    /// across daemons, up to `lease_wait` in all (what is left of it is
    /// the local wait, if this daemon's own holder still has the file).
    /// The file is recovered first if another daemon left it under
    /// construction (that daemon's claim ran out, so its holder is fenced:
    /// see `EtcdLeases`). Returns what is left of `lease_wait`, if it
    /// applies.
    pub(super) fn claim(
        &self,
        cl: &dyn Cluster,
        ino: u64,
        fh: u64,
        flags: i32,
        caller: Caller,
        who: &proc_info::Ident,
    ) -> FsResult<Option<Duration>> {
        let (tid, uid) = (caller.pid, caller.uid);
        let info = ClaimInfo {
            mount_id: self.mount_id.clone(),
            host: self.host.to_string(),
            pid: who.tgid,
            comm: who.comm.clone(),
            since_ms: crate::clock::wall_ms(),
            lease_id: 0,
        };
        // As on one daemon: a holder here that has closed (its release in
        // flight) is waited for, even with O_NONBLOCK.
        let grace = self
            .leases
            .holder_flushed(ino)
            .then(|| self.leases.config().release_grace);
        let lease_wait = self
            .opts
            .lease_wait
            .filter(|_| flags & libc::O_NONBLOCK == 0);
        let wait = match lease_wait {
            Some(w) => Some(w.max(grace.unwrap_or_default())),
            None => grace,
        };
        let until = Instant::now() + wait.unwrap_or_default();
        let mut ticket = None;
        // A head seen leaving the file unclaimed, and since when.
        let mut idle_head: Option<(u64, Instant)> = None;
        // An open that does not wait takes a file nobody claims, whoever
        // queues (their head claims it within tens of milliseconds, or is
        // gone); it is refused while the file is claimed.
        let mut jump = None;
        let r = loop {
            let pass = match idle_head {
                _ if jump.is_some() => jump.take(),
                Some((head, since)) if since.elapsed() >= STALE_HEAD => Some(head),
                _ => ticket,
            };
            let mut behind = false;
            let refused = match cl.claim_in_turn(ino, fh, &info, pass) {
                Err(e) => break Err(FsError::Meta(e)),
                Ok(Turn::Claim(Claim::Mine { .. })) => break Ok(()),
                Ok(Turn::Claim(Claim::Busy(h))) => {
                    idle_head = None;
                    h.describe()
                }
                Ok(Turn::Queued { head, claimed }) => {
                    if wait.is_none() && !claimed && pass != Some(head) {
                        jump = Some(head);
                        continue;
                    }
                    idle_head = match idle_head {
                        _ if claimed => None,
                        Some((h, since)) if h == head => Some((h, since)),
                        _ => Some((head, Instant::now())),
                    };
                    behind = true;
                    "writers queued before this one".to_string()
                }
            };
            if wait.is_none() || Instant::now() >= until {
                tracing::info!(ino, uid, holder = %refused, "file busy across daemons");
                break Err(LeaseError::Busy {
                    file: ino,
                    holder: refused,
                }
                .into());
            }
            if proc_info::signal_pending(tid) {
                break Err(LeaseError::Interrupted { file: ino }.into());
            }
            match ticket {
                None => match cl.enqueue(ino, fh) {
                    Ok(t) => ticket = Some(t),
                    Err(e) => break Err(FsError::Meta(e)),
                },
                // Writers behind the head only need to see their turn
                // come: they look less often than the head.
                Some(_) if behind => std::thread::sleep(CLAIM_RETRY * 4),
                Some(_) => std::thread::sleep(CLAIM_RETRY),
            }
        };
        if ticket.is_some() {
            cl.dequeue(ino, fh);
        }
        r?;
        if let Err(e) = self.recover_foreign(ino) {
            cl.unclaim(ino, fh);
            return Err(e);
        }
        Ok(lease_wait.map(|_| until.saturating_duration_since(Instant::now())))
    }

    /// Recovers `ino` if the store says another daemon instance has it
    /// under construction. Only called while this daemon holds the claim.
    fn recover_foreign(&self, ino: u64) -> FsResult<()> {
        let foreign = self.meta().uc(ino)?.filter(|u| u.mount_id != self.mount_id);
        if let Some(uc) = foreign {
            tracing::warn!(ino, holder = %uc.holder, mount = %uc.mount_id, "recovering a file another daemon left open");
            self.recover(ino, RecoveryReason::HolderGone)?;
        }
        Ok(())
    }

    /// Handle `fh` no longer holds or waits for `ino`'s lease.
    pub(super) fn unclaim(&self, ino: u64, fh: u64) {
        if let Some(cl) = self.cluster.clone() {
            self.ctx.rt.spawn_blocking(move || cl.unclaim(ino, fh));
        }
    }

    /// A writer on another daemon wants `ino`: preempt a holder here that
    /// stopped renewing for the soft limit (recovery, then the claim goes).
    pub fn preempt_for_remote(self: &Arc<Self>, ino: u64) {
        if let Some(t) = self.leases.preempt_expired(ino) {
            tracing::warn!(ino, "a writer on another daemon preempts an expired holder");
            self.spawn_recovery(t);
        }
    }

    /// This daemon's claim of `ino` ran out (etcd did not acknowledge its
    /// keep-alives in time, or the holder stopped renewing): the holder
    /// is fenced and whatever it has not had acknowledged is dropped, before
    /// another daemon can claim the file.
    pub fn claim_lost(self: &Arc<Self>, ino: u64) {
        for h in self.handles.filter(|h| h.ino == ino && h.write) {
            if let Some(s) = &h.stream {
                s.abort(FsError::Lease(LeaseError::Fenced {
                    file: ino,
                    epoch: h.epoch,
                }));
            }
        }
        self.leases
            .revoke(ino, "another daemon (cluster claim lost)");
        self.fences.lease_left_term(ino);
    }

    /// The record of what a writer granted `uc.epoch` does to its file:
    /// over a shared namespace every commit is conditional on the claim
    /// that grant came from, and a commit that finds it gone fences the
    /// file's writers here at once (off the stream's thread, which holds
    /// the stream's lock while it records).
    pub(super) fn file_record(self: &Arc<Self>, uc: UnderConstruction) -> FileRecord {
        if self.cluster.is_none() {
            return FileRecord::new(self.meta().clone(), uc, self.ctx.metrics.clone());
        }
        let (me, epoch) = (Arc::downgrade(self), uc.epoch);
        let fenced = Box::new(move |ino| {
            if let Some(c) = me.upgrade() {
                let c2 = c.clone();
                c.ctx.rt.spawn_blocking(move || c2.claim_gone(ino, epoch));
            }
        });
        FileRecord::claimed(self.meta().clone(), uc, self.ctx.metrics.clone(), fenced)
    }

    /// The store says the claim `epoch` was granted under is gone (revoked
    /// behind this daemon's back, or expired while it stalled): if it is
    /// still this daemon's claim of `ino`, it is dropped and the file's
    /// writers fenced now, whatever the keep-alives say.
    fn claim_gone(self: &Arc<Self>, ino: u64, epoch: u64) {
        if let Some(cl) = &self.cluster
            && cl.lost(ino, epoch)
        {
            tracing::warn!(
                ino,
                epoch,
                "the cluster claim of a file is gone; giving the file up"
            );
            self.claim_lost(ino);
        }
    }

    /// Who claims a file to recover it: the daemon itself.
    pub(super) fn recovery_claimant(&self) -> ClaimInfo {
        ClaimInfo {
            mount_id: self.mount_id.clone(),
            host: self.host.to_string(),
            pid: std::process::id(),
            comm: "leasefs-recovery".into(),
            since_ms: crate::clock::wall_ms(),
            lease_id: 0,
        }
    }

    /// At mount over a shared namespace: recover files left under
    /// construction by daemon instances that are gone, one claim at a time
    /// (a file another daemon still claims is its business).
    pub(super) fn startup_recovery_clustered(&self, cl: &Arc<dyn Cluster>) -> FsResult<usize> {
        let me = self.recovery_claimant();
        let mut n = 0;
        for uc in self.meta().list_uc()? {
            if cl.mount_alive(&uc.mount_id) {
                continue;
            }
            // A handle number no open can have.
            let fh = u64::MAX - uc.ino;
            match cl.claim(uc.ino, fh, &me) {
                Ok(Claim::Mine { .. }) => {
                    tracing::info!(ino = uc.ino, holder = %uc.holder, "recovering file left open by a daemon that is gone");
                    match self.recover(uc.ino, RecoveryReason::HolderGone) {
                        Ok(_) => n += 1,
                        Err(e) => tracing::error!(ino = uc.ino, "recovery failed: {e}"),
                    }
                    cl.unclaim(uc.ino, fh);
                }
                Ok(Claim::Busy(_)) => {}
                Err(e) => tracing::warn!(ino = uc.ino, "cannot claim for recovery: {e}"),
            }
        }
        Ok(n)
    }
}
