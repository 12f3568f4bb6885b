//! The cluster side of [`Core`] (several daemons over etcd): claiming a
//! file before its lease is granted here, giving claims up, losing them,
//! and recovering files that another daemon left under construction.

use std::time::{Duration, Instant};

use super::core::Core;
use super::proc_info;
use crate::error::{FsError, FsResult};
use crate::lease::cluster::{Claim, ClaimInfo, Cluster};
use crate::lease::{LeaseError, RecoveryReason};
use crate::sync::Arc;

/// How often a writer queued on another daemon's claim (`lease_wait`)
/// asks again: etcd has no FIFO queue of our own waiters across daemons.
const CLAIM_RETRY: Duration = Duration::from_millis(100);

impl Core {
    /// Claims `ino` for handle `fh`, waiting up to `lease_wait` (unless
    /// `O_NONBLOCK`) while another daemon holds it, and recovers the file
    /// first if another daemon left it under construction (that daemon's
    /// claim ran out, so its holder is fenced: see `EtcdLeases`).
    pub(super) fn claim(
        &self,
        cl: &dyn Cluster,
        ino: u64,
        fh: u64,
        flags: i32,
        tid: u32,
        who: &proc_info::Ident,
    ) -> FsResult<()> {
        let info = ClaimInfo {
            mount_id: self.mount_id.clone(),
            host: self.host.to_string(),
            pid: who.tgid,
            comm: who.comm.clone(),
            since_ms: crate::clock::wall_ms(),
            lease_id: 0,
        };
        let wait = match self.opts.lease_wait {
            Some(w) if flags & libc::O_NONBLOCK == 0 => w,
            _ => Duration::ZERO,
        };
        let until = Instant::now() + wait;
        loop {
            match cl.claim(ino, fh, &info).map_err(FsError::Meta)? {
                Claim::Mine { .. } => break,
                Claim::Busy(h) => {
                    if Instant::now() >= until {
                        tracing::info!(ino, holder = %h.describe(), "file claimed by another daemon");
                        return Err(LeaseError::Busy {
                            file: ino,
                            holder: h.describe(),
                        }
                        .into());
                    }
                    if proc_info::signal_pending(tid) {
                        return Err(LeaseError::Interrupted { file: ino }.into());
                    }
                    std::thread::sleep(CLAIM_RETRY);
                }
            }
        }
        if let Err(e) = self.recover_foreign(ino) {
            cl.unclaim(ino, fh);
            return Err(e);
        }
        Ok(())
    }

    /// Recovers `ino` if the store says another daemon instance has it
    /// under construction. Only called while this daemon holds the claim.
    fn recover_foreign(&self, ino: u64) -> FsResult<()> {
        let foreign = self.meta.uc(ino)?.filter(|u| u.mount_id != self.mount_id);
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
        for h in self.handles.iter().filter(|h| h.ino == ino && h.write) {
            if let Some(s) = &h.stream {
                s.abort(FsError::Lease(LeaseError::Fenced {
                    file: ino,
                    epoch: h.epoch,
                }));
            }
        }
        self.leases
            .revoke(ino, "another daemon (cluster claim lost)");
        self.lease_left_term(ino);
    }

    /// At mount over a shared namespace: recover files left under
    /// construction by daemon instances that are gone, one claim at a time
    /// (a file another daemon still claims is its business).
    pub(super) fn startup_recovery_clustered(&self, cl: &Arc<dyn Cluster>) -> FsResult<usize> {
        let me = ClaimInfo {
            mount_id: self.mount_id.clone(),
            host: self.host.to_string(),
            pid: std::process::id(),
            comm: "leasefs-recovery".into(),
            since_ms: crate::clock::wall_ms(),
            lease_id: 0,
        };
        let mut n = 0;
        for uc in self.meta.list_uc()? {
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
