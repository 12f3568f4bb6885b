//! The elections' tables in SQLite: the audit table (`election_audit`,
//! what operators query with `elect --history`) and the durable fences of
//! election terms (`election_fences`, see docs/SEMANTICS.md, "Fencing").

use rusqlite::{Connection, params};

use super::MetaStore;
use crate::error::FsResult;
use crate::meta::audit::AuditLog;
use crate::meta::types::{AuditEvent, FenceRecord};
use crate::sync::lock;

impl AuditLog for MetaStore {
    fn audit(&self, e: &AuditEvent) -> FsResult<Option<i64>> {
        self.durable(|tx| audit(tx, e))
    }

    fn audit_history(&self, election: &str) -> FsResult<Vec<AuditEvent>> {
        history(&lock(&self.conn), election, None)
    }

    fn put_fence(&self, f: &FenceRecord) -> FsResult<()> {
        self.durable(|tx| put_fence(tx, f))
    }

    fn delete_fence(&self, owner: &str, pgid: u32) -> FsResult<()> {
        self.durable(|tx| delete_fence(tx, owner, pgid))
    }

    fn fences(&self, owner: &str) -> FsResult<Vec<FenceRecord>> {
        fences(&lock(&self.conn), owner)
    }
}

/// The events of `election` (of one term only, with `epoch`), oldest
/// first.
fn history(c: &Connection, election: &str, epoch: Option<u64>) -> FsResult<Vec<AuditEvent>> {
    let mut st = c.prepare(
        "SELECT election, event, who, host, pid, epoch, at_ms, why FROM election_audit WHERE election = ?1 AND (?2 IS NULL OR epoch = ?2) ORDER BY id",
    )?;
    let rows = st.query_map(params![election, epoch.map(|e| e as i64)], |r| {
        Ok(AuditEvent {
            election: r.get(0)?,
            event: r.get(1)?,
            who: r.get(2)?,
            host: r.get(3)?,
            pid: r.get::<_, i64>(4)? as u32,
            epoch: r.get::<_, i64>(5)? as u64,
            at_ms: r.get::<_, i64>(6)? as u64,
            why: r.get(7)?,
        })
    })?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// Appends `e` unless its term already has it (`None` then).
fn audit(tx: &Connection, e: &AuditEvent) -> FsResult<Option<i64>> {
    if e.is_redundant(&history(tx, &e.election, Some(e.epoch))?) {
        return Ok(None);
    }
    tx.execute(
        "INSERT INTO election_audit(election, event, who, host, pid, epoch, at_ms, why) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        params![e.election, e.event, e.who, e.host, e.pid as i64, e.epoch as i64, e.at_ms as i64, e.why],
    )?;
    Ok(Some(tx.last_insert_rowid()))
}

fn put_fence(tx: &Connection, f: &FenceRecord) -> FsResult<()> {
    tx.execute(
        "INSERT OR REPLACE INTO election_fences(owner, pgid, start_ticks, boot_id, cgroup, leader, ino, epoch, who, pid) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
        params![
            f.owner,
            f.pgid as i64,
            f.start_ticks as i64,
            f.boot_id,
            f.cgroup,
            f.leader,
            f.ino as i64,
            f.epoch as i64,
            f.who,
            f.pid as i64
        ],
    )?;
    Ok(())
}

fn delete_fence(tx: &Connection, owner: &str, pgid: u32) -> FsResult<()> {
    tx.execute(
        "DELETE FROM election_fences WHERE owner = ?1 AND pgid = ?2",
        params![owner, pgid as i64],
    )?;
    Ok(())
}

/// The fences a daemon of lineage `owner` left, by command pid.
fn fences(c: &Connection, owner: &str) -> FsResult<Vec<FenceRecord>> {
    let mut st = c.prepare(
        "SELECT owner, pgid, start_ticks, boot_id, cgroup, leader, ino, epoch, who, pid FROM election_fences WHERE owner = ?1 ORDER BY pgid",
    )?;
    let rows = st.query_map([owner], |r| {
        Ok(FenceRecord {
            owner: r.get(0)?,
            pgid: r.get::<_, i64>(1)? as u32,
            start_ticks: r.get::<_, i64>(2)? as u64,
            boot_id: r.get(3)?,
            cgroup: r.get(4)?,
            leader: r.get(5)?,
            ino: r.get::<_, i64>(6)? as u64,
            epoch: r.get::<_, i64>(7)? as u64,
            who: r.get(8)?,
            pid: r.get::<_, i64>(9)? as u32,
        })
    })?;
    Ok(rows.collect::<Result<_, _>>()?)
}
