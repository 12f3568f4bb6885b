//! [`AuditLog`]: the elections' audit table and the durable fences of
//! election terms (docs/SEMANTICS.md, "Leader election" and "Fencing").

use super::types::{AuditEvent, FenceRecord};
use crate::error::FsResult;

/// How many events of one user the audit table keeps: recording one more
/// drops that user's oldest, so that no user grows the table (and the
/// metadata store) without bound.
pub const MAX_EVENTS_PER_USER: usize = 1000;

/// What elections record durably: who led when and why it ended, and the
/// process trees a term's end must keep refusing.
pub trait AuditLog: Send + Sync {
    /// Appends one election event durably on behalf of user `uid`, unless
    /// it is redundant with the election's events
    /// ([`AuditEvent::is_redundant`], judged in the same atomic step), and
    /// drops that user's oldest events beyond [`MAX_EVENTS_PER_USER`];
    /// returns its sequence number, or `None` when it was left out.
    fn audit(&self, e: &AuditEvent, uid: u32) -> FsResult<Option<i64>>;
    /// The newest `limit` events of one election with a sequence number
    /// below `before` (all of them without), oldest first, with their
    /// sequence numbers.
    fn audit_page(
        &self,
        election: &str,
        before: Option<i64>,
        limit: usize,
    ) -> FsResult<Vec<(i64, AuditEvent)>>;
    /// Every event of one election, oldest first.
    fn audit_history(&self, election: &str) -> FsResult<Vec<AuditEvent>> {
        Ok(self
            .audit_page(election, None, usize::MAX)?
            .into_iter()
            .map(|(_, e)| e)
            .collect())
    }
    /// Records (or replaces) the fence of `f.owner` for process group
    /// `f.pgid`, durably.
    fn put_fence(&self, f: &FenceRecord) -> FsResult<()>;
    /// Forgets a fence; forgetting one that is not there is not an error.
    fn delete_fence(&self, owner: &str, pgid: u32) -> FsResult<()>;
    /// Every fence `owner` recorded.
    fn fences(&self, owner: &str) -> FsResult<Vec<FenceRecord>>;
}
