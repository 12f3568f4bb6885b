//! The lease manager (HDFS `LeaseManager`): one write lease per file, held by
//! one open file description, queued FIFO, renewed by the daemon or by the
//! client, expired by the soft and hard limits, and fenced by epochs.
//!
//! All state sits behind one mutex (the table and its transitions are in
//! `table.rs`); every operation is O(1) or O(log n) under it. Callbacks of queued opens are collected while the lock is held and run
//! (or dropped) only after it is released, so a callback may call back into
//! the manager and a slow reply never holds up other files.
//!
//! The monitor's [`LeaseManager::tick`] costs O(expired items): client-mode
//! leases and waiters sit in a deadline index, and daemon-mode leases in an
//! index by their own renewal time. Daemon renewal is one timestamp shared by
//! all daemon-mode leases (the renewal thread renews all of them or none), so
//! [`LeaseManager::renew_daemon_leases`] is O(1) and its leases expire only
//! when that thread stops.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use tracing::{debug, info, warn};

use super::deferred::Deferred;
use super::index::TimeIndex;
use super::record::{HolderRec, Lease};
use super::table::{Inner, Limits};
use super::types::{
    Acquire, AcquireOpts, EpochSource, FileId, GrantCallback, HandleId, Holder, LeaseConfig,
    LeaseError, LeaseInfo, LeaseState, RecoveryReason, RecoveryTicket, RenewalMode,
};
use crate::clock::Clock;
use crate::sync::{Arc, AtomicU64, Mutex, Ordering, lock};

/// Grants, queues, renews, expires and recovers write leases. `Send + Sync`;
/// share it through an `Arc`.
pub struct LeaseManager {
    cfg: LeaseConfig,
    clock: Arc<dyn Clock>,
    host: Arc<str>,
    inner: Mutex<Inner>,
    /// Index entries `tick` has looked at, ever: what an idle tick must not
    /// increase.
    examined: AtomicU64,
}

impl LeaseManager {
    pub fn new(
        cfg: LeaseConfig,
        clock: Arc<dyn Clock>,
        epochs: Box<dyn EpochSource>,
        host: Arc<str>,
    ) -> Self {
        let lim = Limits {
            soft: nanos(cfg.soft_limit),
            hard: nanos(cfg.hard_limit),
            wait: cfg.lease_wait.map(nanos),
            grace: nanos(cfg.release_grace),
        };
        let inner = Inner {
            lim,
            leases: HashMap::new(),
            holders: HashMap::new(),
            fenced: HashMap::new(),
            contended: HashSet::new(),
            due: TimeIndex::default(),
            daemon: TimeIndex::default(),
            daemon_renewed: nanos(clock.now()),
            last_tick: nanos(clock.now()),
            epochs,
            shutting_down: false,
        };
        LeaseManager {
            cfg,
            clock,
            host,
            inner: Mutex::new(inner),
            examined: AtomicU64::new(0),
        }
    }

    pub fn config(&self) -> &LeaseConfig {
        &self.cfg
    }

    /// The host this manager runs on.
    pub fn host(&self) -> &Arc<str> {
        &self.host
    }

    /// Asks for `file`'s write lease for `holder.handle`:
    /// - free: `Granted` with a new epoch; the holder itself again: `Granted`
    ///   with its epoch;
    /// - held in client mode and not renewed for `soft_limit`: the holder is
    ///   fenced, the caller heads the queue and gets `Recover`;
    /// - held by a holder that flushed and wrote nothing since (its `RELEASE`
    ///   is in flight): `Queued` for `max(release_grace, lease_wait)`, even
    ///   with `nonblock`;
    /// - otherwise `Queued` for `lease_wait` if set and not `nonblock`, else
    ///   `Busy`. A handle that was preempted gets `Fenced`.
    ///
    /// `cb` is kept, and later called exactly once, only for `Queued` and
    /// `Recover`; otherwise it is dropped uncalled.
    pub fn acquire(
        &self,
        file: FileId,
        holder: Holder,
        opts: AcquireOpts,
        cb: GrantCallback,
    ) -> Result<Acquire, LeaseError> {
        self.acquire_within(file, holder, opts, None, cb)
    }

    /// As [`Self::acquire`], queueing for at most `wait` instead of
    /// `lease_wait` when given: what is left of a wait begun elsewhere
    /// (in the queue across daemons).
    pub fn acquire_within(
        &self,
        file: FileId,
        holder: Holder,
        opts: AcquireOpts,
        wait: Option<Duration>,
        cb: GrantCallback,
    ) -> Result<Acquire, LeaseError> {
        // Moved into the state only when the open waits; otherwise dropped
        // here, after the lock is released.
        let mut cb = Some(cb);
        let wait = wait.map(nanos);
        self.locked(|inner, now, _| inner.acquire(file, holder, opts, wait, &mut cb, now))
    }

    /// The end of an open file description (FUSE `RELEASE`). A holder's lease
    /// passes to the first waiter at once; a waiter leaves the queue without
    /// its callback being called. Returns whether anything changed.
    pub fn release(&self, file: FileId, handle: HandleId) -> bool {
        self.locked(|inner, now, later| inner.release(file, handle, now, later))
    }

    /// The holder flushed (`close()` returned) and has written nothing since:
    /// its `RELEASE` is probably in flight, so a conflicting open waits for it.
    pub fn note_flush(&self, file: FileId, handle: HandleId) {
        self.locked(|inner, _, _| {
            if let Some(lease) = inner.held_by(file, handle) {
                lease.flushed = true;
            }
        })
    }

    /// The holder wrote after a flush: it is a live writer again.
    pub fn note_write(&self, file: FileId, handle: HandleId) {
        self.locked(|inner, _, _| {
            if let Some(lease) = inner.held_by(file, handle) {
                lease.flushed = false;
            }
        })
    }

    /// Switches who renews the lease; counts as a renewal.
    pub fn set_mode(
        &self,
        file: FileId,
        handle: HandleId,
        mode: RenewalMode,
    ) -> Result<(), LeaseError> {
        let res = self.locked(|inner, now, _| inner.renew(file, handle, Some(mode), now));
        match &res {
            Ok(()) => debug!(file, handle, ?mode, "lease renewal mode set"),
            // The core logs refusals with the user (rate-limited per user).
            Err(err) => debug!(file, handle, error = %err, "cannot set lease renewal mode"),
        }
        res
    }

    /// Client renewal: proves the holder is alive. Fails once the lease was
    /// preempted (`Fenced`), which tells the client to stop writing.
    pub fn renew(&self, file: FileId, handle: HandleId) -> Result<(), LeaseError> {
        let res = self.locked(|inner, now, _| inner.renew(file, handle, None, now));
        if let Err(err) = &res {
            // The core logs refusals with the user (rate-limited per user).
            debug!(file, handle, error = %err, "lease renewal refused");
        }
        res
    }

    /// Renews every daemon-mode lease; the renewal thread calls this every
    /// `soft_limit / 2`. O(1): daemon-mode leases share this one timestamp.
    /// Returns how many leases it renewed.
    pub fn renew_daemon_leases(&self) -> usize {
        self.locked(|inner, now, _| {
            inner.daemon_renewed = now;
            inner.daemon.len()
        })
    }

    /// Fencing: `Ok` only if `handle` holds `file`'s lease at `epoch`.
    pub fn check(&self, file: FileId, handle: HandleId, epoch: u64) -> Result<(), LeaseError> {
        let inner = lock(&self.inner);
        match inner.leases.get(&file) {
            Some(lease) if lease.holds(handle) => {
                if lease.epoch == epoch {
                    Ok(())
                } else {
                    Err(LeaseError::Fenced { file, epoch })
                }
            }
            _ => Err(inner.not_holding(file, handle)),
        }
    }

    /// The monitor: times out waiters, and starts recovery of leases past the
    /// hard limit and of contended client-mode leases past the soft limit.
    /// The caller runs block recovery for each ticket and then calls
    /// [`Self::finish_recovery`].
    pub fn tick(&self) -> Vec<RecoveryTicket> {
        let mut examined = 0;
        let tickets = self.locked(|inner, now, later| inner.tick(now, later, &mut examined));
        self.examined.fetch_add(examined, Ordering::Relaxed);
        tickets
    }

    /// How many index entries `tick` has examined since the manager was made.
    /// An idle tick adds nothing, however many leases are held.
    pub fn tick_examined(&self) -> u64 {
        self.examined.load(Ordering::Relaxed)
    }

    /// `leasefs recover-lease`: takes a held lease from its holder (who is
    /// fenced) and starts recovery. `None` when the file is free or already
    /// recovering.
    pub fn recover_now(&self, file: FileId) -> Option<RecoveryTicket> {
        self.locked(|inner, now, _| match inner.leases.get(&file) {
            Some(lease) if lease.state == LeaseState::Held => {
                Some(inner.start_recovery(file, RecoveryReason::Manual, now))
            }
            _ => None,
        })
    }

    /// A writer elsewhere (on another daemon) wants `file`: as a local
    /// contender would, it preempts a client-renewed holder that has not
    /// renewed for the soft limit. `None` when there is nothing to preempt.
    pub fn preempt_expired(&self, file: FileId) -> Option<RecoveryTicket> {
        self.locked(|inner, now, _| {
            let lease = inner.leases.get(&file)?;
            let expired = lease.state == LeaseState::Held
                && lease.mode == RenewalMode::Client
                && now.saturating_sub(lease.renewed) >= inner.lim.soft;
            expired.then(|| inner.start_recovery(file, RecoveryReason::SoftLimit, now))
        })
    }

    /// Starts recovery of a file left under construction by a holder that is
    /// provably gone (a previous mount instance, after a crash). Writers
    /// queue or get `EBUSY` until `finish_recovery`. `None` when the manager
    /// already knows the file. `last_epoch` is the persisted epoch of the
    /// last grant, shown until a new grant replaces it.
    pub fn recover_orphan(
        &self,
        file: FileId,
        last_epoch: u64,
        last_holder: Option<Holder>,
    ) -> Option<RecoveryTicket> {
        self.locked(|inner, now, _| {
            if inner.leases.contains_key(&file) {
                return None;
            }
            let mut lease = Lease::new(last_holder.map(HolderRec::from), last_epoch, now);
            let stale = inner.describe(file, &lease, now);
            lease.state = LeaseState::Recovering;
            inner.leases.insert(file, Box::new(lease));
            inner.reindex(file);
            warn!(file, epoch = last_epoch, "holder gone; recovering lease");
            Some(RecoveryTicket {
                file,
                stale,
                reason: RecoveryReason::HolderGone,
            })
        })
    }

    /// Keeps writers off `file` while maintenance works on it
    /// (housekeeping's repairs, recovery of a file left open): `true` when
    /// nobody held, waited for or recovered the file. Until
    /// [`Self::unpin`], a writer that asks waits (even with `O_NONBLOCK`:
    /// the file is not really held), then gets the lease. So maintenance
    /// never acts on a file whose close is in flight, nor a writer on a
    /// file maintenance is changing.
    pub fn pin(&self, file: FileId) -> bool {
        self.locked(|inner, now, _| {
            if inner.shutting_down || inner.leases.contains_key(&file) {
                return false;
            }
            let mut lease = Lease::new(None, 0, now);
            lease.state = LeaseState::Recovering;
            lease.pinned = true;
            inner.leases.insert(file, Box::new(lease));
            true
        })
    }

    /// Ends a [`Self::pin`]: the first waiter gets the lease.
    pub fn unpin(&self, file: FileId) {
        self.locked(|inner, now, later| {
            if inner.leases.get(&file).is_some_and(|l| l.pinned) {
                inner.hand_over(file, now, later)
            }
        })
    }

    /// Ends recovery. `Ok`: the first waiter gets the lease (through its
    /// callback), or the file becomes free. `Err`: every waiter's callback
    /// gets `RecoveryFailed` and the lease is dropped.
    pub fn finish_recovery(&self, file: FileId, result: Result<(), String>) {
        self.locked(|inner, now, later| inner.finish_recovery(file, result, now, later))
    }

    /// The lease was lost outside this manager (its cluster-wide claim ran
    /// out, so another daemon may grant it): the holder is fenced, every
    /// waiter gets `Busy`, and the file is forgotten here. Returns whether
    /// the manager knew the file.
    pub fn revoke(&self, file: FileId, why: &str) -> bool {
        self.locked(|inner, _, later| {
            let Some(lease) = inner.leases.get_mut(&file) else {
                return false;
            };
            warn!(file, epoch = lease.epoch, why, "lease revoked");
            let fence = lease.holder.as_ref().map(|h| (h.handle, lease.epoch));
            for w in lease.take_all() {
                let holder = why.to_string();
                later.call(w.cb, Err(LeaseError::Busy { file, holder }));
            }
            if let Some((handle, epoch)) = fence {
                inner.holders.remove(&handle);
                inner.fenced.insert(handle, (file, epoch));
            }
            inner.remove(file);
            true
        })
    }

    /// Ctrl-C of a waiting open: its callback gets `Interrupted`. Returns
    /// whether `handle` was waiting for `file`.
    pub fn cancel_waiter(&self, file: FileId, handle: HandleId) -> bool {
        self.locked(|inner, _, later| {
            let Some(w) = inner
                .leases
                .get_mut(&file)
                .and_then(|l| l.take_waiter(handle))
            else {
                return false;
            };
            // The core logs it with the user (rate-limited per user).
            debug!(file, handle, pid = w.holder.pid, "lease wait interrupted");
            later.call(w.cb, Err(LeaseError::Interrupted { file }));
            inner.reindex(file);
            true
        })
    }

    /// Every waiting open as (file, handle, pid), for the interrupt watcher.
    /// O(waiters), not O(leases).
    pub fn waiting(&self) -> Vec<(FileId, HandleId, u32)> {
        let inner = lock(&self.inner);
        let mut out = Vec::new();
        for file in &inner.contended {
            if let Some(lease) = inner.leases.get(file) {
                out.extend(
                    lease
                        .waiters()
                        .map(|w| (*file, w.holder.handle, w.holder.pid)),
                );
            }
        }
        out
    }

    /// Whether `file` is held by a holder that flushed and wrote nothing
    /// since: its release is probably in flight (see `acquire`).
    pub fn holder_flushed(&self, file: FileId) -> bool {
        lock(&self.inner)
            .leases
            .get(&file)
            .is_some_and(|l| l.state == LeaseState::Held && l.flushed)
    }

    /// The state of `file`'s lease alone (cheaper than `info`).
    pub fn state(&self, file: FileId) -> LeaseState {
        lock(&self.inner)
            .leases
            .get(&file)
            .map_or(LeaseState::Free, |l| l.state)
    }

    /// `file`'s lease as users see it; `Free` with epoch 0 when unknown.
    pub fn info(&self, file: FileId) -> LeaseInfo {
        self.locked(|inner, now, _| match inner.leases.get(&file) {
            Some(lease) => inner.describe(file, lease, now),
            None => LeaseInfo::free(file),
        })
    }

    /// Every held or recovering lease, by file id (not the files
    /// maintenance has pinned).
    pub fn list(&self) -> Vec<LeaseInfo> {
        let mut all = self.locked(|inner, now, _| {
            inner
                .leases
                .iter()
                .filter(|(_, lease)| !lease.pinned)
                .map(|(&file, lease)| inner.describe(file, lease, now))
                .collect::<Vec<_>>()
        });
        all.sort_unstable_by_key(|i| i.file);
        all
    }

    /// Whether this daemon keeps `file` from writers for a repair.
    pub fn is_pinned(&self, file: FileId) -> bool {
        lock(&self.inner)
            .leases
            .get(&file)
            .is_some_and(|l| l.pinned)
    }

    /// The file whose lease `handle` holds.
    pub fn file_of_handle(&self, handle: HandleId) -> Option<FileId> {
        lock(&self.inner).holders.get(&handle).copied()
    }

    /// Number of held or recovering leases.
    pub fn len(&self) -> usize {
        lock(&self.inner).leases.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Refuses every new acquire; every waiter's callback gets
    /// `ShuttingDown`. Held leases stay until released.
    pub fn shutdown(&self) {
        self.locked(|inner, _, later| {
            inner.shutting_down = true;
            for file in std::mem::take(&mut inner.contended) {
                let Some(lease) = inner.leases.get_mut(&file) else {
                    continue;
                };
                lease.listed = false;
                for w in lease.take_all() {
                    later.call(w.cb, Err(LeaseError::ShuttingDown));
                }
                inner.reindex(file);
            }
            info!("lease manager shut down");
        })
    }

    /// Runs `f` under the lock with the current time, then, with the lock
    /// released, runs the callbacks `f` collected.
    fn locked<R>(&self, f: impl FnOnce(&mut Inner, u64, &mut Deferred) -> R) -> R {
        let mut later = Deferred::default();
        let out = {
            let mut inner = lock(&self.inner);
            // Read under the lock so that times stored in leases never go
            // backwards.
            let now = nanos(self.clock.now());
            f(&mut inner, now, &mut later)
        };
        later.run();
        out
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}
