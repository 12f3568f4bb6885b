//! The lease manager's vocabulary: ids, holders, configuration, the answers
//! of `acquire`, the JSON-visible lease description and the error enum.
//! Nothing here holds state; [`super::manager::LeaseManager`] does.

use std::time::Duration;

use crate::sync::Arc;

/// The file a lease covers (its inode number).
pub type FileId = u64;

/// One open file description (the FUSE `fh`), unique per open. A lease is held
/// by a handle, not by a process: two opens by one process are two writers.
pub type HandleId = u64;

/// Who holds (or waits for) a lease.
#[derive(Clone, Debug)]
pub struct Holder {
    /// Host of the mount instance the writer came through; shared, not copied.
    pub host: Arc<str>,
    pub pid: u32,
    /// Process name, at most 15 bytes as the kernel keeps it; longer names are
    /// cut at 16 bytes when stored.
    pub comm: String,
    pub handle: HandleId,
    pub opened_wall_ms: u64,
}

/// Who keeps a lease alive (DESIGN §1 "Two different heartbeats").
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RenewalMode {
    /// The daemon's renewal thread renews it while the handle is open.
    Daemon,
    /// The holder renews it itself and loses it if it stops.
    Client,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LeaseState {
    Free,
    Held,
    /// The last holder was preempted or is gone; its last block is being made
    /// consistent. Nobody writes until `finish_recovery`.
    Recovering,
}

#[derive(Clone, Debug)]
pub struct LeaseConfig {
    /// A client-renewed lease not renewed for this long may be preempted.
    pub soft_limit: Duration,
    /// Any lease not renewed for this long is recovered by the monitor.
    pub hard_limit: Duration,
    /// `lease_wait=`: how long a conflicting writer queues; `None` means it
    /// gets `EBUSY` at once.
    pub lease_wait: Option<Duration>,
    /// How long a conflicting open waits for a holder that has flushed
    /// (closed) but whose `RELEASE` has not arrived yet.
    pub release_grace: Duration,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        LeaseConfig {
            soft_limit: Duration::from_secs(60),
            hard_limit: Duration::from_secs(3600),
            lease_wait: None,
            release_grace: Duration::from_secs(2),
        }
    }
}

/// A granted lease. The epoch is the fencing token: strictly increasing over
/// all grants, checked on every write through [`super::LeaseManager::check`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    pub epoch: u64,
}

/// Answers a queued `acquire` exactly once, from whichever thread settles it,
/// never while the manager's lock is held.
pub type GrantCallback = Box<dyn FnOnce(Result<Grant, LeaseError>) + Send>;

#[derive(Clone, Copy, Debug, Default)]
pub struct AcquireOpts {
    /// `O_NONBLOCK`: never queue behind a live holder.
    pub nonblock: bool,
}

/// What `acquire` did. Only `Queued` and `Recover` keep the callback; it is
/// dropped unused for `Granted` and for errors.
#[derive(Debug)]
pub enum Acquire {
    Granted(Grant),
    /// The callback will be called once: granted, timed out, interrupted, or
    /// failed.
    Queued,
    /// The previous holder's lease expired; the caller must run block
    /// recovery and then call `finish_recovery`, which grants the caller
    /// through its callback.
    Recover(RecoveryTicket),
}

/// A lease that needs block recovery before anyone may write the file again.
#[derive(Clone, Debug)]
pub struct RecoveryTicket {
    pub file: FileId,
    /// The lease as it was just before recovery started.
    pub stale: LeaseInfo,
    pub reason: RecoveryReason,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RecoveryReason {
    SoftLimit,
    HardLimit,
    HolderGone,
    Manual,
}

/// One lease as users see it (`user.leasefs.lease`, `leasefs leases --json`).
#[derive(Clone, Debug, serde::Serialize)]
pub struct LeaseInfo {
    pub file: FileId,
    pub state: LeaseState,
    /// `host:pid`; while recovering, the holder being recovered.
    pub holder: Option<String>,
    pub comm: Option<String>,
    pub handle: Option<HandleId>,
    /// The current or last grant's epoch; 0 for a file never leased here.
    pub epoch: u64,
    pub mode: Option<RenewalMode>,
    pub renewed_ms_ago: Option<u64>,
    pub opened_wall_ms: Option<u64>,
    pub waiters: usize,
}

impl LeaseInfo {
    pub(crate) fn free(file: FileId) -> Self {
        LeaseInfo {
            file,
            state: LeaseState::Free,
            holder: None,
            comm: None,
            handle: None,
            epoch: 0,
            mode: None,
            renewed_ms_ago: None,
            opened_wall_ms: None,
            waiters: 0,
        }
    }
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum LeaseError {
    #[error("file {file} is being written by {holder}")]
    Busy { file: FileId, holder: String },
    #[error("gave up waiting for the write lease on file {file}")]
    WaitTimedOut { file: FileId },
    #[error("wait for the write lease on file {file} was interrupted")]
    Interrupted { file: FileId },
    #[error("lease of epoch {epoch} on file {file} was taken over by another writer")]
    Fenced { file: FileId, epoch: u64 },
    #[error("handle {handle} does not hold the lease on file {file}")]
    NotHolder { file: FileId, handle: HandleId },
    #[error("lease recovery of file {file} failed: {reason}")]
    RecoveryFailed { file: FileId, reason: String },
    #[error("the lease manager is shutting down")]
    ShuttingDown,
    /// No epoch could be reserved durably: granting without one could
    /// repeat an epoch after a power cut, so the open fails.
    #[error("no epoch for a write lease on file {file}: {reason}")]
    NoEpoch { file: FileId, reason: String },
}

impl LeaseError {
    /// The errno a FUSE reply carries for this error.
    pub fn errno(&self) -> i32 {
        match self {
            LeaseError::Busy { .. } | LeaseError::WaitTimedOut { .. } => libc::EBUSY,
            LeaseError::Interrupted { .. } => libc::EINTR,
            LeaseError::Fenced { .. }
            | LeaseError::NotHolder { .. }
            | LeaseError::RecoveryFailed { .. }
            | LeaseError::ShuttingDown
            | LeaseError::NoEpoch { .. } => libc::EIO,
        }
    }
}

/// Hands out fencing epochs. Called under the manager's lock once per grant,
/// so it must be cheap: a persistent implementation should reserve epochs in
/// blocks rather than write to disk on every call.
pub trait EpochSource: Send {
    /// An epoch for a new grant of `file`: greater than every value returned
    /// before for that file, by this source or by any earlier instance of
    /// the filesystem (or, over etcd, by any other daemon), even across a
    /// power cut. `Err` when none can be promised: the grant fails.
    fn next(&mut self, file: FileId) -> Result<u64, String>;
}
