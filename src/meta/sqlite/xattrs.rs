//! Extended attributes in the `xattrs` table: reads, and the one
//! read-modify-write step every change goes through (see
//! [`crate::meta::Meta::update_xattrs`]).

use rusqlite::{Connection, OptionalExtension, params};

use super::get_inode;
use crate::error::FsResult;
use crate::meta::types::{DecideXattrs, Inode, XattrLimits, now_ns};

pub(super) fn get(c: &Connection, ino: u64, name: &[u8]) -> FsResult<Option<Vec<u8>>> {
    Ok(
        c.prepare_cached("SELECT value FROM xattrs WHERE ino = ?1 AND name = ?2")?
            .query_row(params![ino as i64, name], |r| r.get(0))
            .optional()?,
    )
}

pub(super) fn list(c: &Connection, ino: u64) -> FsResult<Vec<Vec<u8>>> {
    let mut st = c.prepare_cached("SELECT name FROM xattrs WHERE ino = ?1 ORDER BY name")?;
    let rows = st.query_map([ino as i64], |r| r.get(0))?;
    Ok(rows.collect::<Result<_, _>>()?)
}

pub(super) fn put(tx: &Connection, ino: u64, name: &[u8], value: &[u8]) -> FsResult<()> {
    tx.prepare_cached("INSERT OR REPLACE INTO xattrs VALUES(?1, ?2, ?3)")?
        .execute(params![ino as i64, name, value])?;
    Ok(())
}

/// (name, value length) of every attribute of `ino`.
fn sizes(tx: &Connection, ino: u64) -> FsResult<Vec<(Vec<u8>, u64)>> {
    let mut st = tx.prepare_cached("SELECT name, length(value) FROM xattrs WHERE ino = ?1")?;
    let rows = st.query_map([ino as i64], |r| {
        Ok((r.get::<_, Vec<u8>>(0)?, r.get::<_, i64>(1)? as u64))
    })?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// The body of `update_xattrs`, inside the caller's transaction.
pub(super) fn update(
    tx: &Connection,
    ino: u64,
    names: &[&[u8]],
    limits: XattrLimits,
    decide: &mut DecideXattrs<'_>,
) -> FsResult<Inode> {
    let mut inode = get_inode(tx, ino)?;
    let current = names
        .iter()
        .map(|n| get(tx, ino, n))
        .collect::<FsResult<Vec<_>>>()?;
    let edit = decide(&inode, &current)?;
    if edit.is_empty() {
        return Ok(inode);
    }
    if edit.set.iter().any(|(_, v)| v.is_some()) {
        limits.check(ino, &sizes(tx, ino)?, &edit.set)?;
    }
    for (name, value) in &edit.set {
        match value {
            Some(v) => put(tx, ino, name, v)?,
            None => {
                tx.prepare_cached("DELETE FROM xattrs WHERE ino = ?1 AND name = ?2")?
                    .execute(params![ino as i64, name])?;
            }
        }
    }
    let now = now_ns();
    match &edit.attrs {
        Some(ch) => ch.apply(&mut inode, now),
        None => inode.ctime = now,
    }
    tx.prepare_cached(
        "UPDATE inodes SET mode = ?2, uid = ?3, gid = ?4, atime = ?5, mtime = ?6, ctime = ?7 WHERE ino = ?1",
    )?
    .execute(params![
        ino as i64,
        inode.mode as i64,
        inode.uid as i64,
        inode.gid as i64,
        inode.atime,
        inode.mtime,
        inode.ctime
    ])?;
    Ok(inode)
}
