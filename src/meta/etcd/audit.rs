//! [`AuditLog`] on etcd: events `a/<election>/<seq>` (the sequence from
//! the counter `c/audit_seq`) and fences `f/<owner>/<pgid>`.

use super::EtcdMeta;
use super::records::*;
use crate::error::FsResult;
use crate::meta::audit::AuditLog;
use crate::meta::types::{AuditEvent, FenceRecord};

/// The counter that orders the events of all elections.
const AUDIT_SEQ: &str = "audit_seq";

impl AuditLog for EtcdMeta {
    /// Sequence numbers come from one counter, so they order the events of
    /// all daemons as their commits did. The election's events are read in
    /// the same transaction: a concurrent event makes it run again, so the
    /// redundancy check cannot miss one.
    fn audit(&self, e: &AuditEvent) -> FsResult<Option<i64>> {
        self.run(|s| {
            let history: Vec<AuditEvent> = s
                .scan_json::<AuditEvent>(&audit_of(&e.election))?
                .into_iter()
                .map(|(_, e)| e)
                .collect();
            if e.is_redundant(&history) {
                return Ok(None);
            }
            let seq = s.counter(AUDIT_SEQ)?.unwrap_or(0) + 1;
            s.set_counter(AUDIT_SEQ, seq);
            s.put_json(&audit_key(&e.election, seq), e)?;
            Ok(Some(seq as i64))
        })
    }

    fn audit_history(&self, election: &str) -> FsResult<Vec<AuditEvent>> {
        self.run(|s| {
            Ok(s.scan_json::<AuditEvent>(&audit_of(election))?
                .into_iter()
                .map(|(_, e)| e)
                .collect())
        })
    }

    fn put_fence(&self, f: &FenceRecord) -> FsResult<()> {
        self.run(|s| s.put_json(&fence_key(&f.owner, f.pgid), f))
    }

    fn delete_fence(&self, owner: &str, pgid: u32) -> FsResult<()> {
        self.run(|s| {
            s.delete(&fence_key(owner, pgid));
            Ok(())
        })
    }

    fn fences(&self, owner: &str) -> FsResult<Vec<FenceRecord>> {
        self.run(|s| {
            Ok(s.scan_json::<FenceRecord>(&fences_of(owner))?
                .into_iter()
                .map(|(_, f)| f)
                .collect())
        })
    }
}
