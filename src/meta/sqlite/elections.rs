//! The elections' tables in SQLite: the audit table (`election_audit`,
//! what operators query with `elect --history`) and the durable fences of
//! election terms (`election_fences`, see docs/SEMANTICS.md, "Fencing").

use rusqlite::{Connection, params};

use super::MetaStore;
use crate::error::FsResult;
use crate::meta::audit::{AuditLog, MAX_EVENTS_PER_USER};
use crate::meta::types::{AuditEvent, FenceRecord};
use crate::sync::lock;

impl AuditLog for MetaStore {
    fn audit(&self, e: &AuditEvent, uid: u32) -> FsResult<Option<i64>> {
        self.durable(|tx| audit(tx, e, uid))
    }

    fn audit_page(
        &self,
        election: &str,
        before: Option<i64>,
        limit: usize,
    ) -> FsResult<Vec<(i64, AuditEvent)>> {
        page(&lock(&self.conn), election, before, limit)
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

fn event_of(r: &rusqlite::Row<'_>) -> rusqlite::Result<AuditEvent> {
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
}

/// The events of one term of `election`, oldest first.
fn term(c: &Connection, election: &str, epoch: u64) -> FsResult<Vec<AuditEvent>> {
    let mut st = c.prepare(
        "SELECT election, event, who, host, pid, epoch, at_ms, why FROM election_audit WHERE election = ?1 AND epoch = ?2 ORDER BY id",
    )?;
    let rows = st.query_map(params![election, epoch as i64], event_of)?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// The newest `limit` events of `election` below `before`, oldest first.
fn page(
    c: &Connection,
    election: &str,
    before: Option<i64>,
    limit: usize,
) -> FsResult<Vec<(i64, AuditEvent)>> {
    let mut st = c.prepare(
        "SELECT election, event, who, host, pid, epoch, at_ms, why, id FROM election_audit WHERE election = ?1 AND (?2 IS NULL OR id < ?2) ORDER BY id DESC LIMIT ?3",
    )?;
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let rows = st.query_map(params![election, before, limit], |r| {
        Ok((r.get::<_, i64>(8)?, event_of(r)?))
    })?;
    let mut v: Vec<(i64, AuditEvent)> = rows.collect::<Result<_, _>>()?;
    v.reverse();
    Ok(v)
}

/// Appends `e` for `uid` unless its term already has it (`None` then),
/// and drops that user's events beyond the newest [`MAX_EVENTS_PER_USER`].
fn audit(tx: &Connection, e: &AuditEvent, uid: u32) -> FsResult<Option<i64>> {
    if e.is_redundant(&term(tx, &e.election, e.epoch)?) {
        return Ok(None);
    }
    tx.execute(
        "INSERT INTO election_audit(election, event, who, host, pid, epoch, at_ms, why, uid) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        params![e.election, e.event, e.who, e.host, e.pid as i64, e.epoch as i64, e.at_ms as i64, e.why, uid as i64],
    )?;
    let id = tx.last_insert_rowid();
    tx.execute(
        "DELETE FROM election_audit WHERE uid = ?1 AND id <= (SELECT id FROM election_audit WHERE uid = ?1 ORDER BY id DESC LIMIT 1 OFFSET ?2)",
        params![uid as i64, MAX_EVENTS_PER_USER as i64],
    )?;
    Ok(Some(id))
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
