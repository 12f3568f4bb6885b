//! The lease table behind the manager's one lock: every lease, holder,
//! waiter and deadline, and the transitions between them (grant, queue,
//! hand over, renew, expire, recover). [`super::manager::LeaseManager`]
//! takes the lock, reads the clock and runs the callbacks collected here
//! once the lock is released.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};

use tracing::{debug, info, warn};

use super::deferred::Deferred;
use super::index::{TimeIndex, UNSET};
use super::record::{HolderRec, Lease, Waiter};
use super::types::{
    Acquire, AcquireOpts, EpochSource, FileId, Grant, GrantCallback, HandleId, Holder, LeaseError,
    LeaseInfo, LeaseState, RecoveryReason, RecoveryTicket, RenewalMode,
};

/// The configured durations in nanoseconds of the manager's clock.
#[derive(Clone, Copy, Debug)]
pub(super) struct Limits {
    pub(super) soft: u64,
    pub(super) hard: u64,
    pub(super) wait: Option<u64>,
    pub(super) grace: u64,
}

pub(super) struct Inner {
    pub(super) lim: Limits,
    /// Boxed so that the table stays small (16 bytes a slot) at a million
    /// leases and grows by moving pointers, not records.
    pub(super) leases: HashMap<FileId, Box<Lease>>,
    /// Current holders' handles.
    pub(super) holders: HashMap<HandleId, FileId>,
    /// Handles whose lease was taken from them, with the epoch they held, so
    /// that they get `Fenced` rather than `NotHolder`; removed on release.
    pub(super) fenced: HashMap<HandleId, (FileId, u64)>,
    /// Files with at least one waiter.
    pub(super) contended: HashSet<FileId>,
    /// Client-mode leases by next limit, and files by earliest waiter
    /// deadline.
    pub(super) due: TimeIndex,
    /// Held daemon-mode leases by their own last renewal (grant, mode switch
    /// or explicit renew).
    pub(super) daemon: TimeIndex,
    /// When `renew_daemon_leases` last ran; renews every daemon-mode lease.
    pub(super) daemon_renewed: u64,
    /// When the monitor last ticked: a tick long after the one before
    /// finds the whole daemon was stopped, not just its renewal thread.
    pub(super) last_tick: u64,
    pub(super) epochs: Box<dyn EpochSource>,
    pub(super) shutting_down: bool,
}

impl Inner {
    pub(super) fn acquire(
        &mut self,
        file: FileId,
        holder: Holder,
        opts: AcquireOpts,
        wait: Option<u64>,
        cb: &mut Option<GrantCallback>,
        now: u64,
    ) -> Result<Acquire, LeaseError> {
        if self.shutting_down {
            return Err(LeaseError::ShuttingDown);
        }
        // A preempted handle never writes again, even once the file is free.
        if let Some(&(file, epoch)) = self.fenced.get(&holder.handle) {
            return Err(LeaseError::Fenced { file, epoch });
        }
        let lim = Limits {
            wait: wait.or(self.lim.wait),
            ..self.lim
        };
        let Some(lease) = self.leases.get_mut(&file) else {
            return self.grant(file, holder, now).map(Acquire::Granted);
        };
        if lease.holds(holder.handle) {
            return Ok(Acquire::Granted(Grant { epoch: lease.epoch }));
        }
        let held = lease.state == LeaseState::Held;
        if held
            && lease.mode == RenewalMode::Client
            && now.saturating_sub(lease.renewed) >= lim.soft
        {
            let ticket = self.start_recovery(file, RecoveryReason::SoftLimit, now);
            let waiter = Waiter {
                holder,
                deadline: UNSET,
                cb: cb.take().expect("callback taken once"),
            };
            self.lease_mut(file).push_waiter(waiter, true);
            self.reindex(file);
            return Ok(Acquire::Recover(ticket));
        }
        let wait = if lease.pinned {
            // Maintenance, not a writer: wait for it, however long.
            Some(u64::MAX)
        } else if held && lease.flushed {
            // close() returned, RELEASE has not arrived: wait even with
            // O_NONBLOCK, a close-then-reopen must not fail.
            Some(lim.grace.max(lim.wait.unwrap_or(0)))
        } else if opts.nonblock {
            None
        } else {
            lim.wait
        };
        let Some(wait) = wait else {
            return Err(LeaseError::Busy {
                file,
                holder: lease.holder_label(),
            });
        };
        // The caller logs it with the user (rate-limited per user).
        debug!(
            file,
            handle = holder.handle,
            pid = holder.pid,
            current = %lease.holder_label(),
            wait_ms = wait / 1_000_000,
            "queued for lease"
        );
        let waiter = Waiter {
            holder,
            deadline: now.saturating_add(wait),
            cb: cb.take().expect("callback taken once"),
        };
        lease.push_waiter(waiter, false);
        self.reindex(file);
        Ok(Acquire::Queued)
    }

    pub(super) fn release(
        &mut self,
        file: FileId,
        handle: HandleId,
        now: u64,
        later: &mut Deferred,
    ) -> bool {
        let was_fenced = self.fenced.remove(&handle).is_some();
        let Some(lease) = self.leases.get_mut(&file) else {
            return was_fenced;
        };
        if lease.holds(handle) {
            debug!(file, handle, epoch = lease.epoch, "lease released");
            self.holders.remove(&handle);
            self.hand_over(file, now, later);
            return true;
        }
        if let Some(w) = lease.take_waiter(handle) {
            later.discard(w.cb);
            self.reindex(file);
            return true;
        }
        was_fenced
    }

    /// Renews `file`'s lease for its holder, optionally switching mode.
    pub(super) fn renew(
        &mut self,
        file: FileId,
        handle: HandleId,
        mode: Option<RenewalMode>,
        now: u64,
    ) -> Result<(), LeaseError> {
        let Some(lease) = self.held_by(file, handle) else {
            return Err(self.not_holding(file, handle));
        };
        lease.renewed = now;
        if let Some(mode) = mode {
            lease.mode = mode;
        }
        self.reindex(file);
        Ok(())
    }

    pub(super) fn tick(
        &mut self,
        now: u64,
        later: &mut Deferred,
        examined: &mut u64,
    ) -> Vec<RecoveryTicket> {
        let lim = self.lim;
        let mut tickets = Vec::new();
        while let Some(file) = self.due.pop_through(now) {
            *examined += 1;
            let lease = self.lease_mut(file);
            lease.due_key = UNSET;
            for w in lease.take_expired(now) {
                info!(
                    file,
                    handle = w.holder.handle,
                    pid = w.holder.pid,
                    "lease wait timed out"
                );
                later.call(w.cb, Err(LeaseError::WaitTimedOut { file }));
            }
            let mut reason = None;
            if lease.state == LeaseState::Held && lease.mode == RenewalMode::Client {
                let age = now.saturating_sub(lease.renewed);
                if age >= lim.hard {
                    reason = Some(RecoveryReason::HardLimit);
                } else if age >= lim.soft && lease.waiter_count() > 0 {
                    reason = Some(RecoveryReason::SoftLimit);
                }
            }
            match reason {
                Some(reason) => tickets.push(self.start_recovery(file, reason, now)),
                None => self.reindex(file),
            }
        }
        // The monitor ticks every few seconds: half a hard limit without a
        // tick means the daemon was stopped (SIGSTOP, a paused VM). Its
        // daemon-renewed leases are renewed for open descriptors, whose
        // holders waited on the stopped daemon: the pause is not theirs to
        // pay for, so they count as renewed now, as the renewal thread is
        // about to do. (Over etcd, a claim that ran out meanwhile fences
        // them anyway; on one daemon nobody else could have granted.)
        let stopped = now.saturating_sub(self.last_tick);
        self.last_tick = now;
        if stopped >= lim.hard / 2 && self.daemon.len() > 0 {
            warn!(
                stopped_ms = stopped / 1_000_000,
                leases = self.daemon.len(),
                "the daemon did not run for half a hard limit: its daemon-renewed leases count as renewed now"
            );
            self.daemon_renewed = self.daemon_renewed.max(now);
        }
        // A daemon-mode lease has aged max(own renewal, daemon_renewed); only
        // once the renewal thread itself is a hard limit late can any expire.
        if now.saturating_sub(self.daemon_renewed) >= lim.hard {
            let cutoff = now - lim.hard;
            while let Some(file) = self.daemon.pop_through(cutoff) {
                *examined += 1;
                self.lease_mut(file).daemon_key = UNSET;
                tickets.push(self.start_recovery(file, RecoveryReason::HardLimit, now));
            }
        }
        tickets
    }

    pub(super) fn finish_recovery(
        &mut self,
        file: FileId,
        result: Result<(), String>,
        now: u64,
        later: &mut Deferred,
    ) {
        let Some(lease) = self.leases.get_mut(&file) else {
            warn!(file, "finish_recovery for a file without a lease");
            return;
        };
        if lease.state != LeaseState::Recovering {
            warn!(file, state = ?lease.state, "finish_recovery for a lease not under recovery");
            return;
        }
        match result {
            Ok(()) => {
                info!(file, epoch = lease.epoch, "lease recovery finished");
                self.hand_over(file, now, later);
            }
            Err(reason) => {
                warn!(file, epoch = lease.epoch, %reason, "lease recovery failed");
                for w in lease.take_all() {
                    let reason = reason.clone();
                    later.call(w.cb, Err(LeaseError::RecoveryFailed { file, reason }));
                }
                self.remove(file);
            }
        }
    }

    /// Makes `holder` the holder of `file` with a fresh epoch; fails,
    /// changing nothing, when no epoch can be had.
    fn grant(&mut self, file: FileId, holder: Holder, now: u64) -> Result<Grant, LeaseError> {
        let epoch = self.epochs.next(file).map_err(|reason| {
            warn!(file, %reason, "no epoch for a write lease");
            LeaseError::NoEpoch { file, reason }
        })?;
        debug_assert!(
            self.leases.get(&file).is_none_or(|l| epoch > l.epoch),
            "epoch source went backwards"
        );
        let handle = holder.handle;
        debug!(
            file,
            epoch,
            handle,
            holder = %format_args!("{}:{}", holder.host, holder.pid),
            comm = %holder.comm,
            "lease granted"
        );
        let rec = HolderRec::from(holder);
        match self.leases.entry(file) {
            Entry::Vacant(slot) => {
                slot.insert(Box::new(Lease::new(Some(rec), epoch, now)));
            }
            Entry::Occupied(slot) => {
                let lease = slot.into_mut();
                lease.holder = Some(rec);
                lease.epoch = epoch;
                lease.renewed = now;
                lease.state = LeaseState::Held;
                lease.mode = RenewalMode::Daemon;
                lease.flushed = false;
                lease.pinned = false;
            }
        }
        self.holders.insert(handle, file);
        self.reindex(file);
        Ok(Grant { epoch })
    }

    /// Passes a lease nobody holds any more to its first waiter (callback
    /// `Ok`), or forgets the file when nobody waits.
    pub(super) fn hand_over(&mut self, file: FileId, now: u64, later: &mut Deferred) {
        while let Some(w) = self.lease_mut(file).pop_waiter() {
            match self.grant(file, w.holder, now) {
                Ok(grant) => return later.call(w.cb, Ok(grant)),
                Err(e) => later.call(w.cb, Err(e)),
            }
        }
        self.remove(file);
    }

    /// Takes a held lease from its holder, who is fenced from now on.
    pub(super) fn start_recovery(
        &mut self,
        file: FileId,
        reason: RecoveryReason,
        now: u64,
    ) -> RecoveryTicket {
        let stale = self.describe(file, self.leases.get(&file).expect("lease exists"), now);
        let Inner {
            leases,
            holders,
            fenced,
            ..
        } = self;
        let lease = leases.get_mut(&file).expect("lease exists");
        if lease.state == LeaseState::Held {
            if let Some(h) = &lease.holder {
                holders.remove(&h.handle);
                fenced.insert(h.handle, (file, lease.epoch));
            }
            lease.state = LeaseState::Recovering;
        }
        let holder = stale.holder.as_deref().unwrap_or("-");
        match reason {
            RecoveryReason::Manual => {
                info!(
                    file,
                    epoch = stale.epoch,
                    holder,
                    "lease preempted for manual recovery"
                )
            }
            _ => warn!(
                file,
                epoch = stale.epoch,
                holder,
                ?reason,
                renewed_ms_ago = stale.renewed_ms_ago,
                "lease expired; holder preempted, recovering"
            ),
        }
        self.reindex(file);
        RecoveryTicket {
            file,
            stale,
            reason,
        }
    }

    /// Brings `file`'s index keys and waiter listing in line with its state.
    /// Called after every change to a lease.
    pub(super) fn reindex(&mut self, file: FileId) {
        let lim = self.lim;
        let Some(lease) = self.leases.get_mut(&file) else {
            return;
        };
        let held = lease.state == LeaseState::Held;
        let mut due = lease.waiters().map(|w| w.deadline).min().unwrap_or(UNSET);
        if held && lease.mode == RenewalMode::Client {
            due = due.min(lease.renewed.saturating_add(lim.hard));
            if lease.waiter_count() > 0 {
                due = due.min(lease.renewed.saturating_add(lim.soft));
            }
        }
        self.due.set(file, &mut lease.due_key, Some(due));
        let daemon = (held && lease.mode == RenewalMode::Daemon).then_some(lease.renewed);
        self.daemon.set(file, &mut lease.daemon_key, daemon);
        let contended = lease.waiter_count() > 0;
        if contended != lease.listed {
            lease.listed = contended;
            if contended {
                self.contended.insert(file);
            } else {
                self.contended.remove(&file);
            }
        }
    }

    /// Forgets `file`'s lease and every index entry of it.
    pub(super) fn remove(&mut self, file: FileId) {
        let Some(mut lease) = self.leases.remove(&file) else {
            return;
        };
        self.due.set(file, &mut lease.due_key, None);
        self.daemon.set(file, &mut lease.daemon_key, None);
        if lease.listed {
            self.contended.remove(&file);
        }
        if lease.state == LeaseState::Held
            && let Some(h) = &lease.holder
        {
            self.holders.remove(&h.handle);
        }
    }

    pub(super) fn held_by(&mut self, file: FileId, handle: HandleId) -> Option<&mut Lease> {
        self.leases
            .get_mut(&file)
            .filter(|l| l.holds(handle))
            .map(|l| &mut **l)
    }

    fn lease_mut(&mut self, file: FileId) -> &mut Lease {
        self.leases.get_mut(&file).expect("lease exists")
    }

    pub(super) fn not_holding(&self, file: FileId, handle: HandleId) -> LeaseError {
        match self.fenced.get(&handle) {
            Some(&(file, epoch)) => LeaseError::Fenced { file, epoch },
            None => LeaseError::NotHolder { file, handle },
        }
    }

    pub(super) fn describe(&self, file: FileId, lease: &Lease, now: u64) -> LeaseInfo {
        let renewed = match lease.mode {
            RenewalMode::Daemon => lease.renewed.max(self.daemon_renewed),
            RenewalMode::Client => lease.renewed,
        };
        let h = lease.holder.as_ref();
        LeaseInfo {
            file,
            state: lease.state,
            holder: h.map(HolderRec::label),
            comm: h.map(|h| h.comm.as_str().to_owned()),
            handle: h.map(|h| h.handle),
            epoch: lease.epoch,
            mode: h.map(|_| lease.mode),
            renewed_ms_ago: h.map(|_| now.saturating_sub(renewed) / 1_000_000),
            opened_wall_ms: h.map(|h| h.opened_wall_ms),
            waiters: lease.waiter_count(),
        }
    }
}
