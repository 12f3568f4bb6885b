//! [`BlockMap`] on etcd: block rows `b/`, their index `bid/`, files
//! under construction `uc/`, the write path's commits (one Txn each), and
//! the inode deletion that frees blocks.
//!
//! etcd commits are durable on a quorum when they return, so `durable`
//! commits and `sync_if_needed` need nothing more.

use super::EtcdMeta;
use super::records::*;
use super::stm::{Stm, prefix_end};
use crate::error::{FsError, FsResult};
use crate::meta::blockmap::{BlockMap, Change};
use crate::meta::types::*;

fn raise_last_epoch(s: &mut Stm<'_>, ino: u64, epoch: u64) -> FsResult<()> {
    if s.find_inode(ino)?
        .is_some_and(|r| r.inode.last_epoch < epoch)
    {
        s.update_inode(ino, |i| i.last_epoch = epoch)?;
    }
    Ok(())
}

fn put_block(s: &mut Stm<'_>, b: &BlockRow) -> FsResult<()> {
    let key = block_key(b.ino, b.idx);
    let old: Option<BlockRow> = s.get_json(&key)?;
    match old {
        Some(o) if o.block_id == b.block_id => {}
        _ => {
            if let Some(o) = old {
                s.delete_later(block_index_key(o.block_id));
            }
            let at = BlockAt {
                ino: b.ino,
                idx: b.idx,
            };
            s.put_json(&block_index_key(b.block_id), &at)?;
        }
    }
    s.put_json(&key, b)
}

/// All of `changes` in one attempt; returns the rows `DropBlocksFrom` took.
fn commit(s: &mut Stm<'_>, changes: &[Change]) -> FsResult<Vec<BlockRow>> {
    let mut gone = Vec::new();
    for c in changes {
        match c {
            Change::PutBlock(b) => put_block(s, b)?,
            Change::PutBlockIf { expect, row } => {
                let now: Option<BlockRow> = s.get_json(&block_key(row.ino, row.idx))?;
                if now.as_ref() != Some(expect) {
                    return Err(FsError::Moved(format!(
                        "block {} of inode {} changed since it was read",
                        expect.block_id, expect.ino
                    )));
                }
                put_block(s, row)?
            }
            Change::DropBlocksFrom { ino, from } => gone.extend(s.drop_blocks_from(*ino, *from)?),
            Change::SetSize { ino, size, touch } => s.update_inode(*ino, |i| {
                i.size = *size;
                if let Some(t) = touch {
                    i.mtime = *t;
                    i.ctime = *t;
                }
            })?,
            Change::PutUc(uc) => {
                s.put_json(&uc_key(uc.ino), uc)?;
                raise_last_epoch(s, uc.ino, uc.epoch)?;
            }
            Change::DelUc(ino) => s.delete(&uc_key(*ino)),
            Change::SetLastEpoch { ino, epoch } => raise_last_epoch(s, *ino, *epoch)?,
            Change::Claimed { ino, epoch } => s.require_claim(*ino, *epoch)?,
            // Its commits are durable on a quorum already (`journals`).
            Change::Journal(_) | Change::Unjournal(_) => {
                return Err(FsError::Io("the etcd store keeps no block journal".into()));
            }
        }
    }
    Ok(gone)
}

/// Deletes an inode with no name left, with its xattrs, blocks (returned)
/// and under-construction entry. An inode that still has a name is left
/// entirely alone.
pub(super) fn delete_inode(s: &mut Stm<'_>, ino: u64) -> FsResult<Vec<BlockRow>> {
    let found = s.find_inode(ino)?;
    if found.as_ref().is_some_and(|r| r.inode.nlink > 0) {
        return Ok(Vec::new());
    }
    let blocks = s.drop_blocks_from(ino, 0)?;
    if found.is_some() {
        s.delete(&inode_key(ino));
    }
    for p in [xattrs_of(ino), names_of(ino)] {
        s.delete_range(&p, &prefix_end(&p));
    }
    s.delete(&uc_key(ino));
    Ok(blocks)
}

/// The row of block `block_id`: through the `bid/` index, checked
/// against the row itself (an index key may outlive its row for a moment,
/// see `Stm::delete_later`).
fn block_by_id(s: &mut Stm<'_>, block_id: u64) -> FsResult<Option<BlockRow>> {
    let Some(at) = s.get_json::<BlockAt>(&block_index_key(block_id))? else {
        return Ok(None);
    };
    let row: Option<BlockRow> = s.get_json(&block_key(at.ino, at.idx))?;
    Ok(row.filter(|r| r.block_id == block_id))
}

impl EtcdMeta {
    fn scan_blocks(&self, prefix: &str) -> FsResult<Vec<BlockRow>> {
        self.run(|s| {
            Ok(s.scan_json::<BlockRow>(prefix)?
                .into_iter()
                .map(|(_, b)| b)
                .collect())
        })
    }
}

impl BlockMap for EtcdMeta {
    /// One Txn; etcd has made it durable on a quorum when it returns, so
    /// `durable` needs nothing more.
    fn commit(&self, changes: &[Change], _durable: bool) -> FsResult<Vec<BlockRow>> {
        self.run(|s| commit(s, changes))
    }

    fn sync_if_needed(&self) -> FsResult<()> {
        Ok(())
    }

    fn sync_pending(&self) -> bool {
        false
    }

    fn blocks(&self, ino: u64) -> FsResult<Vec<BlockRow>> {
        self.scan_blocks(&blocks_of(ino))
    }

    fn all_blocks(&self) -> FsResult<Vec<BlockRow>> {
        self.scan_blocks(BLOCKS)
    }

    fn block_by_id(&self, block_id: u64) -> FsResult<Option<BlockRow>> {
        self.run(|s| block_by_id(s, block_id))
    }

    fn uc(&self, ino: u64) -> FsResult<Option<UnderConstruction>> {
        self.run(|s| s.get_json(&uc_key(ino)))
    }

    /// Over etcd every daemon reads the entries: removed at once.
    fn close_lazily(&self, ino: u64) -> FsResult<()> {
        self.commit(&[Change::DelUc(ino)], false).map(drop)
    }

    fn settle_closes(&self) -> FsResult<()> {
        Ok(())
    }

    fn list_uc(&self) -> FsResult<Vec<UnderConstruction>> {
        self.run(|s| {
            Ok(s.scan_json::<UnderConstruction>(UCS)?
                .into_iter()
                .map(|(_, u)| u)
                .collect())
        })
    }
}
