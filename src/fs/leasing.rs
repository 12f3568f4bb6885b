//! The lease side of [`Core`]: interrupted and expiring waits, epochs of
//! grants, fencing of handles (by lease, and by election term through the
//! process group), lease recovery, and the lease ioctls.

use super::core::{Core, IOC_CLIENT_RENEWAL, IOC_EPOCH, IOC_RENEW, Invalidator};
use super::handles::Handle;
use super::proc_info;
use crate::error::{FsError, FsResult};
use crate::lease::{LeaseError, RecoveryReason, RecoveryTicket, RenewalMode};
use crate::metrics::Recovery;
use crate::pipeline::recovery;
use crate::sync::{Arc, lock};

impl Core {
    /// Waiting opens whose thread got an interrupting signal: cancelled
    /// with EINTR.
    pub fn interrupt_waiters(&self) {
        for (file, handle, _) in self.leases.waiting() {
            let Some(tid) = self.waiter_tids.get(&handle).map(|t| *t) else {
                continue;
            };
            if proc_info::signal_pending(tid) && self.leases.cancel_waiter(file, handle) {
                tracing::info!(file, tid, "waiting open interrupted");
            }
        }
    }

    /// The epoch of the current or last grant of `ino`.
    pub fn last_epoch(&self, ino: u64) -> FsResult<u64> {
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
        if let Err(e) = self.fences.check(h.fence) {
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
        recovery::recover_file(&**self.meta(), self.dns(), ino)
    }

    pub fn set_invalidator(&self, f: Invalidator) {
        self.cache.set_invalidator(f);
    }

    /// The control service listens on the abstract socket `name`.
    pub fn set_control_address(&self, name: String) {
        let _ = self.control_address.set(name);
    }

    /// `leasefs recover-lease`: recovers now; Ok(true) when the file is closed.
    pub fn recover_now(self: &Arc<Self>, ino: u64) -> FsResult<bool> {
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

    pub fn ioctl(&self, fh: u64, cmd: u32) -> FsResult<Vec<u8>> {
        let h = self.handles.get(fh)?;
        if !h.write {
            return Err(FsError::BadHandle);
        }
        // A fenced command's own descriptors renew nothing either.
        self.fences.check(h.fence)?;
        match cmd {
            IOC_CLIENT_RENEWAL => {
                self.leases.set_mode(h.ino, fh, RenewalMode::Client)?;
                Ok(Vec::new())
            }
            IOC_RENEW => {
                self.leases.renew(h.ino, fh)?;
                Ok(Vec::new())
            }
            IOC_EPOCH => {
                self.leases.check(h.ino, fh, h.epoch)?;
                Ok(h.epoch.to_le_bytes().to_vec())
            }
            _ => Err(FsError::Unsupported("unknown ioctl")),
        }
    }
}
