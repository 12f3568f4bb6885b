//! [`BlockMap`] on SQLite: the `blocks` and `under_construction` tables,
//! and the write path's commits (one transaction each, synced on request),
//! including the compare-and-set of a row that datanode administration
//! makes.

use rusqlite::{Connection, OptionalExtension, params};

use super::{MetaStore, UC_COLS, row_to_block, row_to_uc};
use crate::error::{FsError, FsResult};
use crate::meta::blockmap::{BlockMap, Change};
use crate::meta::types::{BlockRow, DnId, JournalRow, UnderConstruction};
use crate::sync::{Ordering, lock};

/// Lazy closes waiting for a commit at most (see
/// [`BlockMap::close_lazily`]): a few KiB, and as many entries a crash
/// leaves to the next mount's recovery at most.
pub(super) const LAZY_CLOSES_MAX: usize = 256;

pub(super) fn replicas_text(r: &[DnId]) -> String {
    r.iter()
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// Records a file's length (and mtime/ctime when `touch` is given).
fn set_size(tx: &Connection, ino: u64, size: u64, touch: Option<i64>) -> FsResult<()> {
    match touch {
        Some(t) => tx
            .prepare_cached("UPDATE inodes SET size = ?2, mtime = ?3, ctime = ?3 WHERE ino = ?1")?
            .execute(params![ino as i64, size as i64, t])?,
        None => tx
            .prepare_cached("UPDATE inodes SET size = ?2 WHERE ino = ?1")?
            .execute(params![ino as i64, size as i64])?,
    };
    Ok(())
}

fn blocks_in(c: &Connection, ino: u64) -> FsResult<Vec<BlockRow>> {
    let mut st = c.prepare_cached(
        "SELECT ino, idx, block_id, gs, len, finalized, replicas FROM blocks WHERE ino = ?1 ORDER BY idx",
    )?;
    let rows = st.query_map([ino as i64], row_to_block)?;
    Ok(rows.collect::<Result<_, _>>()?)
}

pub(super) fn put_block(tx: &Connection, b: &BlockRow) -> FsResult<()> {
    tx.prepare_cached("INSERT OR REPLACE INTO blocks VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7)")?
        .execute(params![
            b.ino as i64,
            b.idx as i64,
            b.block_id as i64,
            b.gs as i64,
            b.len as i64,
            b.finalized as i64,
            replicas_text(&b.replicas)
        ])?;
    Ok(())
}

/// Removes blocks with index >= `from`; returns them so their replicas
/// can be deleted.
pub(super) fn drop_blocks_from(tx: &Connection, ino: u64, from: u64) -> FsResult<Vec<BlockRow>> {
    let gone = blocks_in(tx, ino)?
        .into_iter()
        .filter(|b| b.idx >= from)
        .collect();
    tx.prepare_cached("DELETE FROM blocks WHERE ino = ?1 AND idx >= ?2")?
        .execute(params![ino as i64, from as i64])?;
    Ok(gone)
}

fn set_last_epoch(tx: &Connection, ino: u64, epoch: u64) -> FsResult<()> {
    tx.prepare_cached("UPDATE inodes SET last_epoch = ?2 WHERE ino = ?1 AND last_epoch < ?2")?
        .execute(params![ino as i64, epoch as i64])?;
    Ok(())
}

fn put_uc(tx: &Connection, uc: &UnderConstruction) -> FsResult<()> {
    tx.prepare_cached(
        "INSERT OR REPLACE INTO under_construction VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?
    .execute(params![
        uc.ino as i64,
        uc.holder,
        uc.pid as i64,
        uc.comm,
        uc.epoch as i64,
        uc.mount_id,
        uc.since_ms as i64
    ])?;
    set_last_epoch(tx, uc.ino, uc.epoch)
}

pub(super) fn del_uc(tx: &Connection, ino: u64) -> FsResult<()> {
    tx.prepare_cached("DELETE FROM under_construction WHERE ino = ?1")?
        .execute([ino as i64])?;
    Ok(())
}

/// [`crate::meta::Change::PutBlockIf`], in transaction `tx`.
fn put_block_if(tx: &Connection, expect: &BlockRow, row: &BlockRow) -> FsResult<()> {
    let now = tx
        .prepare_cached(
            "SELECT ino, idx, block_id, gs, len, finalized, replicas FROM blocks
             WHERE ino = ?1 AND idx = ?2",
        )?
        .query_row(params![row.ino as i64, row.idx as i64], row_to_block)
        .optional()?;
    if now.as_ref() != Some(expect) {
        return Err(FsError::Moved(format!(
            "block {} of inode {} changed since it was read",
            expect.block_id, expect.ino
        )));
    }
    put_block(tx, row)
}

impl BlockMap for MetaStore {
    fn commit(&self, changes: &[Change], durable: bool) -> FsResult<Vec<BlockRow>> {
        let apply = |tx: &Connection| {
            let mut gone = Vec::new();
            for c in changes {
                match c {
                    Change::PutBlock(b) => put_block(tx, b)?,
                    Change::PutBlockIf { expect, row } => put_block_if(tx, expect, row)?,
                    Change::DropBlocksFrom { ino, from } => {
                        gone.extend(drop_blocks_from(tx, *ino, *from)?)
                    }
                    Change::SetSize { ino, size, touch } => set_size(tx, *ino, *size, *touch)?,
                    Change::PutUc(uc) => put_uc(tx, uc)?,
                    Change::DelUc(ino) => del_uc(tx, *ino)?,
                    Change::SetLastEpoch { ino, epoch } => set_last_epoch(tx, *ino, *epoch)?,
                    // One daemon: its lease manager fences.
                    Change::Claimed { .. } => {}
                    Change::Journal(j) => {
                        tx.prepare_cached(
                            "INSERT OR REPLACE INTO block_journal VALUES(?1, ?2, ?3)",
                        )?
                        .execute(params![
                            j.block_id as i64,
                            j.gs as i64,
                            j.data
                        ])?;
                    }
                    Change::Unjournal(id) => {
                        tx.prepare_cached("DELETE FROM block_journal WHERE block_id = ?1")?
                            .execute([*id as i64])?;
                    }
                }
            }
            Ok(gone)
        };
        if durable {
            self.durable(apply)
        } else {
            self.with_tx(apply)
        }
    }

    /// Makes every commit so far durable, unless that is already so: an
    /// fsync that changed no metadata since the last one costs nothing here.
    fn sync_if_needed(&self) -> FsResult<()> {
        let seen = self.commits.load(Ordering::Acquire);
        let covered = || self.synced.load(Ordering::Acquire) >= seen;
        if covered() {
            return Ok(());
        }
        self.group.run(covered, || {
            // Every commit counted here wrote its frames before it was
            // counted: the sync covers them all, whoever made them.
            let upto = self.commits.load(Ordering::Acquire);
            self.sync_wal_once()?;
            self.synced.fetch_max(upto, Ordering::AcqRel);
            Ok(())
        })
    }

    fn sync_pending(&self) -> bool {
        self.synced.load(Ordering::Acquire) < self.commits.load(Ordering::Acquire)
    }

    /// Every commit counted wrote its frames to the WAL (`write`, into
    /// the page cache of the WAL's filesystem) before it was counted, so a
    /// `syncfs` of that filesystem begun after the count makes them
    /// durable as an `fdatasync` of the WAL would. Not once a sync of the
    /// WAL failed: that error stays the store's answer.
    fn commits_on_fs(&self) -> Option<(u64, u64)> {
        if lock(&self.sync_failed).is_some() {
            return None;
        }
        // Unit tests that fail or slow the WAL's syncs need them to run.
        #[cfg(test)]
        if lock(&self.sync_fault).is_some() || !lock(&self.sync_delay).is_zero() {
            return None;
        }
        Some((self.dev, self.commits.load(Ordering::Acquire)))
    }

    fn synced_by_fs(&self, commits: u64) {
        self.synced.fetch_max(commits, Ordering::AcqRel);
    }

    fn blocks(&self, ino: u64) -> FsResult<Vec<BlockRow>> {
        blocks_in(&lock(&self.conn), ino)
    }

    fn all_blocks(&self) -> FsResult<Vec<BlockRow>> {
        let c = lock(&self.conn);
        let mut st = c.prepare(
            "SELECT ino, idx, block_id, gs, len, finalized, replicas FROM blocks ORDER BY ino, idx",
        )?;
        let rows = st.query_map([], row_to_block)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    fn block_by_id(&self, block_id: u64) -> FsResult<Option<BlockRow>> {
        let c = lock(&self.conn);
        Ok(c.prepare_cached(
            "SELECT ino, idx, block_id, gs, len, finalized, replicas FROM blocks WHERE block_id = ?1",
        )?
        .query_row([block_id as i64], row_to_block)
        .optional()?)
    }

    fn list_uc(&self) -> FsResult<Vec<UnderConstruction>> {
        let c = lock(&self.conn);
        let mut st = c.prepare(&format!("SELECT {UC_COLS} FROM under_construction"))?;
        let rows = st.query_map([], row_to_uc)?;
        let mut all: Vec<UnderConstruction> = rows.collect::<Result<_, _>>()?;
        all.retain(|u| !self.closed_lazily(u.ino));
        Ok(all)
    }

    /// The removal waits for the next commit (a small file's close after
    /// its whole fsync is then no transaction of its own; the next
    /// create's carries it), or for [`Self::settle_closes`]. Bounded: past
    /// `LAZY_CLOSES_MAX` waiting, they are committed at once.
    fn close_lazily(&self, ino: u64) -> FsResult<()> {
        let c = lock(&self.conn);
        let mut lazy = lock(&self.lazy_closes);
        lazy.push(ino);
        let full = lazy.len() >= LAZY_CLOSES_MAX;
        drop(lazy);
        drop(c);
        // The close is done either way: a failed commit keeps them waiting.
        if full && let Err(e) = self.settle_closes() {
            tracing::warn!("committing lazy closes: {e}");
        }
        Ok(())
    }

    fn settle_closes(&self) -> FsResult<()> {
        if lock(&self.lazy_closes).is_empty() {
            return Ok(());
        }
        self.with_tx(|_| Ok(()))
    }

    fn journals(&self) -> bool {
        true
    }

    fn journal_rows(&self) -> FsResult<Vec<JournalRow>> {
        let c = lock(&self.conn);
        let mut st = c.prepare("SELECT block_id, gs, data FROM block_journal ORDER BY block_id")?;
        let rows = st.query_map([], |r| {
            Ok(JournalRow {
                block_id: r.get::<_, i64>(0)? as u64,
                gs: r.get::<_, i64>(1)? as u64,
                data: r.get(2)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    fn uc(&self, ino: u64) -> FsResult<Option<UnderConstruction>> {
        let c = lock(&self.conn);
        if self.closed_lazily(ino) {
            return Ok(None);
        }
        Ok(c.prepare_cached(&format!(
            "SELECT {UC_COLS} FROM under_construction WHERE ino = ?1"
        ))?
        .query_row([ino as i64], row_to_uc)
        .optional()?)
    }
}
