//! Directory entries in the `dentries` table: lookups, the entry writes
//! every namespace step shares, and the page query of listings.

use rusqlite::{Connection, OptionalExtension, params};

use super::get_inode;
use crate::error::{FsError, FsResult};
use crate::meta::types::{Inode, Kind};

/// One page of a directory, in cookie order.
pub(super) const READDIR_PAGE: &str = "SELECT d.name, d.ino, i.kind, d.cookie FROM dentries d \
     JOIN inodes i ON i.ino = d.ino \
     WHERE d.parent = ?1 AND d.cookie > ?2 ORDER BY d.cookie LIMIT ?3";

pub(super) fn lookup_in(tx: &Connection, parent: u64, name: &[u8]) -> FsResult<Option<u64>> {
    Ok(entry_in(tx, parent, name)?.map(|(ino, _)| ino))
}

/// The entry `parent/name` as (ino, cookie).
pub(super) fn entry_in(tx: &Connection, parent: u64, name: &[u8]) -> FsResult<Option<(u64, u64)>> {
    Ok(tx
        .prepare_cached("SELECT ino, cookie FROM dentries WHERE parent = ?1 AND name = ?2")?
        .query_row(params![parent as i64, name], |r| {
            Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)? as u64))
        })
        .optional()?)
}

/// Points `parent/name` at `ino`, placed at `cookie` in listings.
pub(super) fn put_entry(
    tx: &Connection,
    parent: u64,
    name: &[u8],
    ino: u64,
    cookie: u64,
) -> FsResult<()> {
    tx.prepare_cached("INSERT OR REPLACE INTO dentries VALUES(?1, ?2, ?3, ?4)")?
        .execute(params![parent as i64, name, ino as i64, cookie as i64])?;
    Ok(())
}

pub(super) fn touch_dir(tx: &Connection, dir: u64, nlink_delta: i64, now: i64) -> FsResult<()> {
    tx.prepare_cached(
        "UPDATE inodes SET mtime = ?2, ctime = ?2, nlink = nlink + ?3 WHERE ino = ?1",
    )?
    .execute(params![dir as i64, now, nlink_delta])?;
    Ok(())
}

pub(super) fn require_dir(tx: &Connection, ino: u64) -> FsResult<Inode> {
    let i = get_inode(tx, ino)?;
    if i.kind != Kind::Dir {
        return Err(FsError::NotDir);
    }
    Ok(i)
}

pub(super) fn is_empty_dir(tx: &Connection, ino: u64) -> FsResult<bool> {
    Ok(tx
        .prepare_cached("SELECT 1 FROM dentries WHERE parent = ?1 LIMIT 1")?
        .query_row([ino as i64], |_| Ok(()))
        .optional()?
        .is_none())
}
