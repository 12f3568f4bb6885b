//! [`AuditLog`] on etcd: events `a/<election>/<seq>` (the sequence from
//! the counter `c/audit_seq`), each also listed under the user who
//! recorded it (`au/<uid>/<seq>`, naming the event's key: a user's oldest
//! events beyond [`MAX_EVENTS_PER_USER`] go), and fences
//! `f/<owner>/<pgid>`.

use super::EtcdMeta;
use super::records::*;
use crate::error::FsResult;
use crate::meta::audit::{AuditLog, MAX_EVENTS_PER_USER};
use crate::meta::types::{AuditEvent, FenceRecord};

/// The counter that orders the events of all elections.
const AUDIT_SEQ: &str = "audit_seq";

impl AuditLog for EtcdMeta {
    /// Sequence numbers come from one counter, so they order the events of
    /// all daemons as their commits did. The election's events are read in
    /// the same transaction: a concurrent event makes it run again, so the
    /// redundancy check cannot miss one.
    fn audit(&self, e: &AuditEvent, uid: u32) -> FsResult<Option<i64>> {
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
            let key = audit_key(&e.election, seq);
            s.put_json(&key, e)?;
            s.put_json(&audit_user_key(uid, seq), &key)?;
            // How many the user has, counted rather than scanned; beyond
            // the bound, the oldest goes (the first of the user's index).
            let count = format!("audit_n/{uid:08x}");
            let n = s.counter(&count)?.unwrap_or(0) + 1;
            if n as usize > MAX_EVENTS_PER_USER {
                let prefix = audit_by_user(uid);
                let oldest = s.scan(&prefix, &super::stm::prefix_end(&prefix), Some(1))?;
                for (index, event) in oldest {
                    let event: String = decode(&index, &event)?;
                    s.delete(&event);
                    s.delete(&index);
                }
                s.set_counter(&count, n - 1);
            } else {
                s.set_counter(&count, n);
            }
            Ok(Some(seq as i64))
        })
    }

    fn audit_page(
        &self,
        election: &str,
        before: Option<i64>,
        limit: usize,
    ) -> FsResult<Vec<(i64, AuditEvent)>> {
        let prefix = audit_of(election);
        let mut all: Vec<(i64, AuditEvent)> = self.run(|s| {
            s.scan_json::<AuditEvent>(&prefix)?
                .into_iter()
                .map(|(k, e)| {
                    let seq = u64::from_str_radix(&k[prefix.len()..], 16)
                        .map_err(|_| crate::error::FsError::Meta(format!("bad audit key {k}")))?;
                    Ok((seq as i64, e))
                })
                .collect()
        })?;
        all.retain(|(seq, _)| before.is_none_or(|b| *seq < b));
        let skip = all.len().saturating_sub(limit);
        Ok(all.split_off(skip))
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
