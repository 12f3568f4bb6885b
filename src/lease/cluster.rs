//! Cluster-wide claims of write leases, for several daemons over one
//! namespace (the etcd backend).
//!
//! The [`LeaseManager`](super::LeaseManager) arbitrates the open handles of
//! one daemon. Across daemons, a file's lease is first *claimed* for the
//! daemon: only the daemon holding the claim may grant the file's lease to
//! one of its handles. A claim lives as long as some local handle holds or
//! waits for the lease and the daemon keeps it alive; when the daemon dies
//! (or its holder stops renewing) the claim runs out after the soft limit
//! and another daemon may claim the file and recover it.

use serde::{Deserialize, Serialize};

use super::types::{FileId, HandleId};

/// Who claimed a file: the value stored with the claim, shown to writers
/// on other daemons that are refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimInfo {
    pub mount_id: String,
    pub host: String,
    pub pid: u32,
    pub comm: String,
    pub since_ms: u64,
    /// The etcd lease the claim is bound to, so that a successor of a
    /// crashed daemon on the same data directory can end its claims.
    #[serde(default)]
    pub lease_id: i64,
}

impl ClaimInfo {
    /// `host:pid (comm)`, the holder as `EBUSY` logs and listings show it.
    pub fn describe(&self) -> String {
        format!("{}:{} ({})", self.host, self.pid, self.comm)
    }
}

/// The answer to a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// This daemon holds the file's claim; `epoch_base` orders every grant
    /// under it after every grant under any earlier claim of the file.
    Mine { epoch_base: u64 },
    /// Another daemon holds it.
    Busy(ClaimInfo),
}

/// Why [`Cluster::renew`] did not renew a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unrenewed {
    /// The claim is gone (etcd does not know it, or this daemon gave it
    /// up): the holder is fenced.
    Lost,
    /// etcd did not confirm the renewal in time: the claim may still be
    /// valid, until its deadline.
    Unconfirmed,
}

/// A place in the queue of writers waiting for a file across daemons.
pub type Ticket = u64;

/// The answer to a claim made in turn ([`Cluster::claim_in_turn`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Turn {
    /// The claim was made (or refused by its holder).
    Claim(Claim),
    /// A writer queued earlier (`head`) goes first; `claimed`: whether
    /// some daemon holds the file's claim meanwhile.
    Queued { head: Ticket, claimed: bool },
}

/// The cluster side of leases. Calls may wait on the network: never make
/// them on a FUSE request thread.
pub trait Cluster: Send + Sync {
    /// Claims `file` for local `handle` (which is about to hold or wait for
    /// the lease), whoever waits for it. Several handles of this daemon
    /// share one claim.
    fn claim(&self, file: FileId, handle: HandleId, who: &ClaimInfo) -> Result<Claim, String>;
    /// As [`Cluster::claim`], but only in turn: while writers queue for
    /// the file, only the head may claim it. `pass` is the head this
    /// claimant may go before: its own ticket, or a head found stale.
    fn claim_in_turn(
        &self,
        file: FileId,
        handle: HandleId,
        who: &ClaimInfo,
        pass: Option<Ticket>,
    ) -> Result<Turn, String>;
    /// Queues `handle` for `file`, FIFO across daemons.
    fn enqueue(&self, file: FileId, handle: HandleId) -> Result<Ticket, String>;
    /// Leaves the queue (the wait ended, or the claim was made).
    fn dequeue(&self, file: FileId, handle: HandleId);
    /// `handle` no longer holds or waits for `file`'s lease; the last one
    /// gives the claim up at once, so another daemon need not wait.
    fn unclaim(&self, file: FileId, handle: HandleId);
    /// The metadata store found the claim `epoch` was granted under gone
    /// (its commit compared the claim and failed): if this daemon still
    /// counts that claim as its own, it forgets it and returns true (the
    /// caller fences the file's writers).
    fn lost(&self, file: FileId, epoch: u64) -> bool;
    /// A client renewal of the lease granted at `epoch`, made good across
    /// daemons: the claim is renewed in etcd now, and `Ok(valid)` only
    /// once etcd confirmed it; no other daemon can claim the file within
    /// `valid` of the call.
    fn renew(&self, file: FileId, epoch: u64) -> Result<std::time::Duration, Unrenewed>;
    /// The epoch base of this daemon's claim of `file`, as an epoch
    /// (`base << EPOCH_SEQ_BITS`), if it holds one: what its recoveries of
    /// the file are recorded under.
    fn held(&self, file: FileId) -> Option<u64>;
    /// Ends another daemon's claim of `file` in etcd (as `etcdctl lease
    /// revoke` would): that daemon fences its writers at its next commit
    /// or keep-alive. For `recover-lease` asked of this daemon.
    fn end_remote(&self, file: FileId, claim: &ClaimInfo);
    /// The claim of `file` held by another daemon, if any.
    fn remote_holder(&self, file: FileId) -> Option<ClaimInfo>;
    /// Every claim, with who holds it (`leasefs leases` shows the files
    /// other daemons hold).
    fn claims(&self) -> Result<Vec<(FileId, ClaimInfo)>, String>;
    /// Every file some daemon has claimed: housekeeping and fsck leave
    /// their last blocks alone (they are being written).
    fn claimed_files(&self) -> Result<Vec<FileId>, String>;
    /// Whether the daemon instance `mount_id` is alive (its liveness key
    /// has not run out).
    fn mount_alive(&self, mount_id: &str) -> bool;
}

/// Bits of an epoch below the claim's base: grants of one file within one
/// claim. A claim's base is an etcd revision, which fits the upper 40 bits
/// for any cluster that lives less than 10^12 revisions.
pub const EPOCH_SEQ_BITS: u32 = 24;
