//! The lease side of [`Core`]: interrupted and expiring waits, epochs of
//! grants, fencing of handles (by lease, and by election term through the
//! process group), lease recovery, and the lease ioctls.

use super::core::{Core, IOC_CLIENT_RENEWAL, IOC_EPOCH, IOC_RENEW, IOC_RENEW_VALID, Invalidator};
use super::handles::Handle;
use super::proc_info;
use crate::error::{FsError, FsResult};
use crate::lease::cluster::Unrenewed;
use crate::lease::{LeaseError, RecoveryReason, RecoveryTicket, RenewalMode};
use crate::metrics::Recovery;
use crate::pipeline::recovery;
use crate::sync::{Arc, lock};

impl Core {
    /// Waiting opens whose thread got an interrupting signal: cancelled
    /// with EINTR.
    pub fn interrupt_waiters(&self) {
        for (file, handle, _) in self.leases.waiting() {
            let Some((tid, uid)) = self.waiter_tids.get(&handle).map(|t| *t) else {
                continue;
            };
            if proc_info::signal_pending(tid) && self.leases.cancel_waiter(file, handle) {
                tracing::info!(file, tid, uid, "waiting open interrupted");
            }
        }
    }

    /// The epoch of the current or last grant of `ino`. Over etcd the
    /// store's, whichever daemon granted it: every grant is recorded there
    /// before its open returns (`Core::record_grant`).
    pub fn last_epoch(&self, ino: u64) -> FsResult<u64> {
        if self.cluster.is_some() {
            return Ok(self.meta().get(ino)?.last_epoch);
        }
        let e = self.leases.info(ino).epoch;
        if e != 0 {
            return Ok(e);
        }
        if let Some(e) = self.epochs.unrecorded(ino) {
            return Ok(e);
        }
        Ok(self.meta().get(ino)?.last_epoch)
    }

    /// Records the epochs of recent grants with their inodes.
    pub fn persist_epochs(&self) {
        self.epochs.persist(&**self.meta())
    }

    /// May this write handle still change its file? Its lease must be the
    /// one it was granted, and its process group's election term (if any)
    /// must not be over. A handle fenced by its term loses what it has not
    /// flushed: its stream is aborted, so a frozen old leader adds nothing.
    pub(super) fn writable(&self, h: &Handle) -> FsResult<()> {
        self.leases.check(h.ino, h.fh, h.epoch)?;
        if let Err(e) = self.fences.check(h.fence, h.uid) {
            if let Some(s) = &h.stream {
                s.abort(e.clone());
            }
            return Err(e);
        }
        Ok(())
    }

    // ---- leases: recovery, renewal, ioctl ------------------------------

    /// Runs lease recovery for a ticket off the caller's thread.
    pub fn spawn_recovery(self: &Arc<Self>, ticket: RecoveryTicket) {
        let me = self.clone();
        self.ctx.rt.spawn_blocking(move || {
            let r = me.recover(ticket.file, ticket.reason);
            // Recorded before the lease can move on: the next leader of an
            // election finds its predecessor's end in the audit table.
            me.fences
                .audit_preemption(&ticket, me.opts.soft_limit, &me.mount_id);
            me.leases
                .finish_recovery(ticket.file, r.map(|_| ()).map_err(|e| e.to_string()));
            // The preempted holder no longer keeps the file's claim.
            if let Some(h) = ticket.stale.handle {
                me.unclaim(ticket.file, h);
            }
            me.fences.lease_left_term(ticket.file);
        });
    }

    /// Fences the old writer's stream, then brings the file to a closed,
    /// consistent state. Runs off the request threads: it waits for the
    /// kernel to drop the file's pages before it returns (and before the
    /// lease can move on to another writer).
    pub fn recover(&self, ino: u64, reason: RecoveryReason) -> FsResult<u64> {
        self.cache.busy(ino);
        // Recovery cuts and restamps the last block (under new names).
        self.ctx.ledger.forget(ino);
        let r = self.recover_file(ino, reason);
        self.cache.invalidate_all_now(ino);
        self.cache.idle(ino);
        r
    }

    fn recover_file(&self, ino: u64, reason: RecoveryReason) -> FsResult<u64> {
        if let Some(of) = self.handles.file(ino) {
            let old = lock(&of.stream).take();
            if let Some(s) = old {
                let epoch = self.leases.info(ino).epoch;
                s.abort(FsError::Lease(LeaseError::Fenced { file: ino, epoch }));
            }
        }
        tracing::info!(ino, ?reason, path = %self.meta().path_of(ino), "lease recovery");
        self.ctx.metrics.recovery(match reason {
            RecoveryReason::SoftLimit => Recovery::SoftLimit,
            RecoveryReason::HardLimit => Recovery::HardLimit,
            RecoveryReason::HolderGone => Recovery::HolderGone,
            RecoveryReason::Manual => Recovery::Manual,
        });
        let how = self.recovery_of(ino)?;
        recovery::recover_file(&**self.meta(), self.dns(), ino, how)
    }

    /// How `ino` is recovered here: over a shared namespace, under this
    /// daemon's claim of it, and into a new block when another daemon
    /// instance had it under construction (its stream may still run: a
    /// stopped or cut-off daemon learns it lost the claim only later).
    /// Without the claim nothing is recorded: whoever holds it now may be
    /// writing the file, and recovers it itself when it claims it.
    fn recovery_of(&self, ino: u64) -> FsResult<recovery::Recovery> {
        let Some(cl) = &self.cluster else {
            return Ok(recovery::Recovery::default());
        };
        let Some(claim) = cl.held(ino) else {
            let epoch = self.leases.info(ino).epoch;
            tracing::warn!(
                ino,
                epoch,
                "no recovery: this daemon no longer holds the file's claim"
            );
            return Err(FsError::Lease(LeaseError::Fenced { file: ino, epoch }));
        };
        let foreign = self
            .meta()
            .uc(ino)?
            .is_some_and(|u| u.mount_id != self.mount_id);
        Ok(recovery::Recovery {
            claim: Some(claim),
            fresh_block: foreign,
        })
    }

    pub fn set_invalidator(&self, f: Invalidator) {
        self.cache.set_invalidator(f);
    }

    pub fn set_storer(&self, f: super::cache::Storer) {
        self.cache.set_storer(f);
    }

    /// The control service listens on the abstract socket `name`.
    pub fn set_control_address(&self, name: String) {
        let _ = self.control_address.set(name);
    }

    /// `leasefs recover-lease`: recovers now; Ok(true) when the file is closed.
    pub fn recover_now(self: &Arc<Self>, ino: u64) -> FsResult<bool> {
        if let Some(cl) = self.cluster.clone()
            && self.leases.state(ino) == crate::lease::LeaseState::Free
        {
            return self.recover_claimed(&*cl, ino);
        }
        match self.leases.recover_now(ino) {
            Some(t) => {
                let r = self.recover(ino, RecoveryReason::Manual);
                self.leases
                    .finish_recovery(ino, r.as_ref().map(|_| ()).map_err(|e| e.to_string()));
                if let Some(h) = t.stale.handle {
                    self.unclaim(ino, h);
                }
                r.map(|_| true)
            }
            None => {
                let info = self.leases.info(ino);
                if info.state == crate::lease::LeaseState::Recovering {
                    return Ok(false);
                }
                // No live lease: a leftover under-construction record is closed now.
                if self.meta().uc(ino)?.is_some() {
                    self.recover(ino, RecoveryReason::HolderGone)?;
                }
                Ok(true)
            }
        }
    }

    /// `recover-lease` over etcd of a file no handle here holds: the claim
    /// of the daemon that holds it, if any, is ended in etcd (that daemon
    /// fences its writer at its next commit or keep-alive, and records
    /// nothing of the file from then on), then the file is claimed here,
    /// recovered if it is under construction, and released. So the answer
    /// is the same whichever daemon is asked: HDFS's recoverLease, which
    /// any client asks of the one NameNode. `Ok(false)` when a writer
    /// claimed the file in between.
    fn recover_claimed(&self, cl: &dyn crate::lease::cluster::Cluster, ino: u64) -> FsResult<bool> {
        if let Some(c) = cl.remote_holder(ino) {
            cl.end_remote(ino, &c);
        }
        // A handle number no open can have.
        let pseudo = u64::MAX - ino;
        match cl.claim(ino, pseudo, &self.recovery_claimant()) {
            Ok(crate::lease::cluster::Claim::Mine { .. }) => {
                let r = match self.meta().uc(ino) {
                    Ok(Some(_)) => self.recover(ino, RecoveryReason::Manual).map(|_| true),
                    Ok(None) => Ok(true),
                    Err(e) => Err(e),
                };
                cl.unclaim(ino, pseudo);
                r
            }
            Ok(crate::lease::cluster::Claim::Busy(_)) => Ok(false),
            Err(e) => Err(FsError::Meta(e)),
        }
    }

    /// A client renewal through handle `h`; returns how long from now no
    /// other writer can be granted the file. Over etcd the file's claim is
    /// renewed first, and the renewal succeeds only once etcd confirmed
    /// it: a renewal that succeeded during a partition would promise the
    /// lease for a soft limit that other daemons do not respect. A claim
    /// etcd says is gone fences the holder at once (`EIO`); one not
    /// confirmed in time fails with `ETIMEDOUT` (try again: the claim may
    /// still be valid until the daemon gives it up).
    fn renew_client(self: &Arc<Self>, h: &Handle) -> FsResult<std::time::Duration> {
        self.leases.check(h.ino, h.fh, h.epoch)?;
        let soft = self.opts.soft_limit;
        let valid = match &self.cluster {
            None => soft,
            Some(cl) => match cl.renew(h.ino, h.epoch) {
                Ok(v) => v.min(soft),
                Err(Unrenewed::Lost) => {
                    self.claim_lost(h.ino);
                    return Err(LeaseError::Fenced {
                        file: h.ino,
                        epoch: h.epoch,
                    }
                    .into());
                }
                Err(Unrenewed::Unconfirmed) => {
                    return Err(FsError::Unconfirmed(format!(
                        "etcd did not confirm the renewal of file {}'s claim in time",
                        h.ino
                    )));
                }
            },
        };
        self.leases.renew(h.ino, h.fh)?;
        Ok(valid)
    }

    pub fn ioctl(self: &Arc<Self>, fh: u64, cmd: u32) -> FsResult<Vec<u8>> {
        let h = self.handles.get(fh)?;
        if !h.write {
            return Err(FsError::BadHandle);
        }
        let r = self.lease_ioctl(&h, cmd);
        if let Err(e) = &r {
            tracing::warn!(
                ino = h.ino,
                fh,
                uid = h.uid,
                cmd,
                "lease ioctl refused: {e}"
            );
        }
        r
    }

    fn lease_ioctl(self: &Arc<Self>, h: &Handle, cmd: u32) -> FsResult<Vec<u8>> {
        let fh = h.fh;
        // A fenced command's own descriptors renew nothing either.
        self.fences.check(h.fence, h.uid)?;
        match cmd {
            IOC_CLIENT_RENEWAL => {
                self.leases.set_mode(h.ino, fh, RenewalMode::Client)?;
                Ok(Vec::new())
            }
            IOC_RENEW => self.renew_client(h).map(|_| Vec::new()),
            IOC_RENEW_VALID => self
                .renew_client(h)
                .map(|v| (v.as_millis() as u64).to_le_bytes().to_vec()),
            IOC_EPOCH => {
                self.leases.check(h.ino, fh, h.epoch)?;
                Ok(h.epoch.to_le_bytes().to_vec())
            }
            _ => Err(FsError::Unsupported("unknown ioctl")),
        }
    }
}
