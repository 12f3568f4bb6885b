//! [`AuditLog`]: the elections' audit table and the durable fences of
//! election terms (docs/SEMANTICS.md, "Leader election" and "Fencing").

use super::types::{AuditEvent, FenceRecord};
use crate::error::FsResult;

/// What elections record durably: who led when and why it ended, and the
/// process trees a term's end must keep refusing.
pub trait AuditLog: Send + Sync {
    /// Appends one election event durably, unless it is redundant with
    /// the election's events ([`AuditEvent::is_redundant`], judged in the
    /// same atomic step); returns its sequence number, or `None` when it
    /// was left out.
    fn audit(&self, e: &AuditEvent) -> FsResult<Option<i64>>;
    /// The events of one election, oldest first.
    fn audit_history(&self, election: &str) -> FsResult<Vec<AuditEvent>>;
    /// Records (or replaces) the fence of `f.owner` for process group
    /// `f.pgid`, durably.
    fn put_fence(&self, f: &FenceRecord) -> FsResult<()>;
    /// Forgets a fence; forgetting one that is not there is not an error.
    fn delete_fence(&self, owner: &str, pgid: u32) -> FsResult<()>;
    /// Every fence `owner` recorded.
    fn fences(&self, owner: &str) -> FsResult<Vec<FenceRecord>>;
}
