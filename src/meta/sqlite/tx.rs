//! [`SqlTx`]: the reads and writes the namespace rules make
//! ([`crate::meta::rules::Tx`]), as statements on the `inodes`,
//! `dentries` and `xattrs` tables of one connection (inside the caller's
//! transaction when the step writes).

use rusqlite::{Connection, OptionalExtension, params};

use super::find_inode;
use crate::error::FsResult;
use crate::meta::rules::{Entry, Tx};
use crate::meta::types::{Inode, Kind};

pub(super) struct SqlTx<'c>(pub(super) &'c Connection);

/// The value of xattr `name` of `ino`.
pub(super) fn xattr(c: &Connection, ino: u64, name: &[u8]) -> FsResult<Option<Vec<u8>>> {
    Ok(
        c.prepare_cached("SELECT value FROM xattrs WHERE ino = ?1 AND name = ?2")?
            .query_row(params![ino as i64, name], |r| r.get(0))
            .optional()?,
    )
}

/// The directory holding a name of `ino` (a directory has one).
pub(super) fn first_parent(c: &Connection, ino: u64) -> FsResult<Option<u64>> {
    Ok(
        c.prepare_cached("SELECT parent FROM dentries WHERE ino = ?1 LIMIT 1")?
            .query_row([ino as i64], |r| r.get::<_, i64>(0))
            .optional()?
            .map(|v| v as u64),
    )
}

impl Tx for SqlTx<'_> {
    fn inode(&mut self, ino: u64) -> FsResult<Option<Inode>> {
        find_inode(self.0, ino)
    }

    fn entry(&mut self, parent: u64, name: &[u8]) -> FsResult<Option<Entry>> {
        Ok(self
            .0
            .prepare_cached("SELECT ino, cookie FROM dentries WHERE parent = ?1 AND name = ?2")?
            .query_row(params![parent as i64, name], |r| {
                Ok(Entry {
                    ino: r.get::<_, i64>(0)? as u64,
                    cookie: r.get::<_, i64>(1)? as u64,
                })
            })
            .optional()?)
    }

    fn is_empty_dir(&mut self, dir: u64) -> FsResult<bool> {
        Ok(self
            .0
            .prepare_cached("SELECT 1 FROM dentries WHERE parent = ?1 LIMIT 1")?
            .query_row([dir as i64], |_| Ok(()))
            .optional()?
            .is_none())
    }

    fn first_parent(&mut self, ino: u64) -> FsResult<Option<u64>> {
        first_parent(self.0, ino)
    }

    fn first_name(&mut self, ino: u64) -> FsResult<Option<(u64, Vec<u8>)>> {
        Ok(self
            .0
            .prepare_cached("SELECT parent, name FROM dentries WHERE ino = ?1 LIMIT 1")?
            .query_row([ino as i64], |r| {
                Ok((r.get::<_, i64>(0)? as u64, r.get(1)?))
            })
            .optional()?)
    }

    fn xattr(&mut self, ino: u64, name: &[u8]) -> FsResult<Option<Vec<u8>>> {
        xattr(self.0, ino, name)
    }

    fn xattr_sizes(&mut self, ino: u64) -> FsResult<Vec<(Vec<u8>, u64)>> {
        let mut st = self
            .0
            .prepare_cached("SELECT name, length(value) FROM xattrs WHERE ino = ?1")?;
        let rows = st.query_map([ino as i64], |r| {
            Ok((r.get::<_, Vec<u8>>(0)?, r.get::<_, i64>(1)? as u64))
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    fn insert_inode(&mut self, i: &Inode, target: Option<&[u8]>) -> FsResult<()> {
        self.0
            .prepare_cached(concat!(
                "INSERT INTO inodes(",
                inode_cols!(),
                ", target) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)"
            ))?
            .execute(params![
                i.ino as i64,
                i.kind as i64,
                i.mode as i64,
                i.uid as i64,
                i.gid as i64,
                i.nlink as i64,
                i.size as i64,
                i.rdev as i64,
                i.atime,
                i.mtime,
                i.ctime,
                i.crtime,
                i.block_size as i64,
                i.last_epoch as i64,
                target
            ])?;
        Ok(())
    }

    fn put_attrs(&mut self, i: &Inode) -> FsResult<()> {
        self.0
            .prepare_cached(
                "UPDATE inodes SET mode = ?2, uid = ?3, gid = ?4, atime = ?5, mtime = ?6, ctime = ?7 WHERE ino = ?1",
            )?
            .execute(params![
                i.ino as i64,
                i.mode as i64,
                i.uid as i64,
                i.gid as i64,
                i.atime,
                i.mtime,
                i.ctime
            ])?;
        Ok(())
    }

    fn add_nlink(&mut self, ino: u64, delta: i64, ctime: i64) -> FsResult<()> {
        self.0
            .prepare_cached("UPDATE inodes SET nlink = nlink + ?2, ctime = ?3 WHERE ino = ?1")?
            .execute(params![ino as i64, delta, ctime])?;
        Ok(())
    }

    fn set_ctime(&mut self, ino: u64, ctime: i64) -> FsResult<()> {
        self.0
            .prepare_cached("UPDATE inodes SET ctime = ?2 WHERE ino = ?1")?
            .execute(params![ino as i64, ctime])?;
        Ok(())
    }

    fn touch_dir(&mut self, dir: u64, nlink_delta: i64, now: i64) -> FsResult<()> {
        self.0
            .prepare_cached(
                "UPDATE inodes SET mtime = ?2, ctime = ?2, nlink = nlink + ?3 WHERE ino = ?1",
            )?
            .execute(params![dir as i64, now, nlink_delta])?;
        Ok(())
    }

    /// One row per entry, so a replaced entry is simply overwritten.
    fn put_entry(
        &mut self,
        parent: u64,
        name: &[u8],
        e: Entry,
        _kind: Kind,
        _replacing: Option<Entry>,
    ) -> FsResult<()> {
        self.0
            .prepare_cached("INSERT OR REPLACE INTO dentries VALUES(?1, ?2, ?3, ?4)")?
            .execute(params![parent as i64, name, e.ino as i64, e.cookie as i64])?;
        Ok(())
    }

    fn remove_entry(&mut self, parent: u64, name: &[u8], _e: Entry) -> FsResult<()> {
        self.0
            .prepare_cached("DELETE FROM dentries WHERE parent = ?1 AND name = ?2")?
            .execute(params![parent as i64, name])?;
        Ok(())
    }

    fn drop_inode(&mut self, ino: u64) -> FsResult<()> {
        self.0
            .prepare_cached("DELETE FROM inodes WHERE ino = ?1")?
            .execute([ino as i64])?;
        self.0
            .prepare_cached("DELETE FROM xattrs WHERE ino = ?1")?
            .execute([ino as i64])?;
        Ok(())
    }

    fn put_xattr(&mut self, ino: u64, name: &[u8], value: &[u8]) -> FsResult<()> {
        self.0
            .prepare_cached("INSERT OR REPLACE INTO xattrs VALUES(?1, ?2, ?3)")?
            .execute(params![ino as i64, name, value])?;
        Ok(())
    }

    fn remove_xattr(&mut self, ino: u64, name: &[u8]) -> FsResult<()> {
        self.0
            .prepare_cached("DELETE FROM xattrs WHERE ino = ?1 AND name = ?2")?
            .execute(params![ino as i64, name])?;
        Ok(())
    }
}
