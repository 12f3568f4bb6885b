//! [`Namespace`] on SQLite: each step runs its rule
//! ([`crate::meta::rules`]) on [`SqlTx`], reads on the locked connection
//! and changes in one transaction; listings and the write open's combined
//! read are queries of their own.

use rusqlite::{OptionalExtension, params};

use super::tx::{SqlTx, xattr};
use super::{MetaStore, blocks, get_inode, row_to_inode};
use crate::error::{FsError, FsResult};
use crate::meta::counters::{Counter, Counters};
use crate::meta::namespace::Namespace;
use crate::meta::rules::{self, Rename};
use crate::meta::types::*;
use crate::sync::lock;

/// One page of a directory, in cookie order.
pub(super) const READDIR_PAGE: &str = "SELECT d.name, d.ino, i.kind, d.cookie FROM dentries d \
     JOIN inodes i ON i.ino = d.ino \
     WHERE d.parent = ?1 AND d.cookie > ?2 ORDER BY d.cookie LIMIT ?3";

impl Namespace for MetaStore {
    fn get(&self, ino: u64) -> FsResult<Inode> {
        get_inode(&lock(&self.reader), ino)
    }

    fn lookup(&self, parent: u64, name: &[u8]) -> FsResult<Inode> {
        rules::lookup(&mut SqlTx(&lock(&self.reader)), parent, name)
    }

    fn parent_of(&self, dir: u64) -> FsResult<u64> {
        if dir == ROOT_INO {
            // The rule's answer, without taking the connection.
            return Ok(ROOT_INO);
        }
        rules::parent_of(&mut SqlTx(&lock(&self.conn)), dir)
    }

    fn create(&self, parent: u64, name: &[u8], n: NewNode<'_>) -> FsResult<Inode> {
        let now = now_ns();
        // From the reserved batch, as block ids: a failed create leaves a
        // gap, which costs nothing.
        let ids = (self.alloc(Counter::Ino)?, self.alloc(Counter::Cookie)?);
        self.with_tx(|tx| rules::create(&mut SqlTx(tx), parent, name, &n, ids, now))
    }

    fn readlink(&self, ino: u64) -> FsResult<Vec<u8>> {
        let c = lock(&self.conn);
        let t: Option<Vec<u8>> = c
            .prepare_cached("SELECT target FROM inodes WHERE ino = ?1")?
            .query_row([ino as i64], |r| r.get(0))
            .optional()?
            .ok_or(FsError::NotFound)?;
        t.ok_or(FsError::Invalid("not a symlink".into()))
    }

    fn link(&self, ino: u64, parent: u64, name: &[u8]) -> FsResult<Inode> {
        let now = now_ns();
        let cookie = self.alloc(Counter::Cookie)?;
        self.with_tx(|tx| rules::link(&mut SqlTx(tx), ino, (parent, name), cookie, now))
    }

    fn unlink(&self, parent: u64, name: &[u8]) -> FsResult<Inode> {
        let now = now_ns();
        self.with_tx(|tx| rules::unlink(&mut SqlTx(tx), parent, name, now))
    }

    fn rmdir(&self, parent: u64, name: &[u8]) -> FsResult<u64> {
        let now = now_ns();
        self.with_tx(|tx| rules::rmdir(&mut SqlTx(tx), parent, name, now))
    }

    fn rename(
        &self,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        noreplace: bool,
        exchange: bool,
    ) -> FsResult<Option<Inode>> {
        let now = now_ns();
        let r = Rename {
            parent,
            name,
            newparent,
            newname,
            noreplace,
            exchange,
        };
        self.with_tx(|tx| rules::rename(&mut SqlTx(tx), &r, now))
    }

    /// A page of the directory through the `dentries_by_cookie` index.
    fn readdir(&self, dir: u64, after: u64, limit: usize) -> FsResult<Vec<DirEntry>> {
        let c = lock(&self.conn);
        rules::require_dir(&mut SqlTx(&c), dir)?;
        let mut st = c.prepare_cached(READDIR_PAGE)?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let after = i64::try_from(after).unwrap_or(i64::MAX);
        let rows = st.query_map(params![dir as i64, after, limit], |r| {
            Ok(DirEntry {
                name: r.get(0)?,
                ino: r.get::<_, i64>(1)? as u64,
                kind: Kind::from_i64(r.get(2)?),
                cookie: r.get::<_, i64>(3)? as u64,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    fn set_attrs(&self, ino: u64, ch: &AttrChange) -> FsResult<Inode> {
        let now = now_ns();
        self.with_tx(|tx| rules::set_attrs(&mut SqlTx(tx), ino, ch, now))
    }

    /// The first name found for each inode on the way up; `<ino N>` if
    /// the database cannot be read.
    fn path_of(&self, ino: u64) -> String {
        rules::path_of(&mut SqlTx(&lock(&self.conn)), ino)
            .unwrap_or_else(|_| format!("<ino {ino}>"))
    }

    fn orphans(&self) -> FsResult<Vec<u64>> {
        let c = lock(&self.conn);
        let mut st = c.prepare("SELECT ino FROM inodes WHERE nlink <= 0")?;
        let rows = st.query_map([], |r| Ok(r.get::<_, i64>(0)? as u64))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    fn delete_inode(&self, ino: u64) -> FsResult<Vec<BlockRow>> {
        self.with_tx(|tx| {
            let gone = blocks::drop_blocks_from(tx, ino, 0)?;
            tx.prepare_cached("DELETE FROM inodes WHERE ino = ?1 AND nlink <= 0")?
                .execute([ino as i64])?;
            tx.prepare_cached("DELETE FROM xattrs WHERE ino = ?1")?
                .execute([ino as i64])?;
            blocks::del_uc(tx, ino)?;
            Ok(gone)
        })
    }

    fn usage(&self) -> FsResult<(u64, u64)> {
        let c = lock(&self.conn);
        Ok(c.query_row(
            "SELECT COUNT(*), COALESCE(SUM(size), 0) FROM inodes",
            [],
            |r| Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)? as u64)),
        )?)
    }

    fn getxattr(&self, ino: u64, name: &[u8]) -> FsResult<Vec<u8>> {
        xattr(&lock(&self.conn), ino, name)?.ok_or(FsError::NoXattr)
    }

    fn get_with_xattr(&self, ino: u64, name: &[u8]) -> FsResult<(Inode, Option<Vec<u8>>)> {
        lock(&self.reader)
            .prepare_cached(concat!(
                "SELECT ",
                inode_cols!(),
                ", (SELECT value FROM xattrs WHERE ino = ?1 AND name = ?2)",
                " FROM inodes WHERE ino = ?1"
            ))?
            .query_row(params![ino as i64, name], |r| {
                Ok((row_to_inode(r)?, r.get::<_, Option<Vec<u8>>>(14)?))
            })
            .optional()?
            .ok_or(FsError::NotFound)
    }

    fn listxattr(&self, ino: u64) -> FsResult<Vec<Vec<u8>>> {
        let c = lock(&self.conn);
        let mut st = c.prepare_cached("SELECT name FROM xattrs WHERE ino = ?1 ORDER BY name")?;
        let rows = st.query_map([ino as i64], |r| r.get(0))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    fn update_xattrs(
        &self,
        ino: u64,
        names: &[&[u8]],
        limits: XattrLimits,
        decide: &mut DecideXattrs<'_>,
    ) -> FsResult<Inode> {
        let now = now_ns();
        self.with_tx(|tx| rules::update_xattrs(&mut SqlTx(tx), ino, names, limits, decide, now))
    }
}
