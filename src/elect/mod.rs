//! Lease-based leader election on a leasefs mount (`leasefs elect`,
//! docs/SEMANTICS.md "Leader election"), as in the Hive Metastore's `LeaseLeaderElection` with the
//! renew deadline of Kubernetes' `leaderelection`, plus a fencing token that
//! the filesystem itself enforces.
//!
//! Candidates compete for the one write lease on `ELECTION_DIR/LEADER`: the
//! open that gets it wins, every other open gets `EBUSY` and its candidate
//! follows, trying again every `retry`. The winner switches the lease to
//! client renewal at once, so the lease lives only as long as the winner
//! renews it; a follower whose open arrives after the lease went unrenewed
//! for the soft limit makes the daemon recover it (the clean-up) and wins.
//! The term's epoch is the lease grant's epoch: strictly increasing, handed
//! to the command as `LEASEFS_EPOCH`, and enforced by the daemon for the
//! command's whole process tree (see [`command`]).
//!
//! Module map:
//! - [`timing`]: lease, renew interval, renew deadline, retry; the pure
//!   renew-deadline bookkeeping;
//! - [`leader_file`]: the election file's descriptor (ioctls), its records
//!   and the lease as the `user.leasefs.lease` xattr shows it;
//! - [`control`]: the audit events and fencing requests sent to the daemon;
//! - [`command`]: starting the leader's command fenced, in a session (and
//!   cgroup) of its own, and stopping that whole tree;
//! - `guard`: renewals that never make the leader wait on its daemon, and
//!   the watchdog that stops the command's tree at its deadlines;
//! - `verdict`: how a new leader accounts for its predecessor's term;
//! - [`elector`]: the candidate / leader loop.

pub mod command;
pub mod control;
pub mod elector;
mod guard;
pub mod leader_file;
pub mod timing;
mod verdict;

pub use control::{Control, EventKind};
pub use elector::{Elector, Outcome, TermEnd};
pub use timing::Timing;

use std::path::PathBuf;

/// Name of the election file inside the election directory.
pub const LEADER_FILE: &str = "LEADER";

/// Why an elector gave up. Losing or resigning leadership is not an error;
/// these are the failures after which running on would be pointless.
#[derive(Debug, thiserror::Error)]
pub enum ElectError {
    #[error("invalid election timing: {0}")]
    Timing(String),
    #[error("election directory {path}: {source}")]
    Dir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot open the election file {path}: {source}")]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} does not behave like a file on a leasefs mount ({what}: {source})")]
    NotLeasefs {
        path: PathBuf,
        what: &'static str,
        source: std::io::Error,
    },
    #[error("the leasefs daemon refused {what}: {reason}")]
    Control { what: &'static str, reason: String },
    #[error("cannot start the command {program}: {reason}")]
    Spawn { program: String, reason: String },
}
