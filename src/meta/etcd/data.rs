//! The write path's commits, the inode deletion that frees blocks, and the
//! block index.

use super::records::*;
use super::stm::{Stm, prefix_end};
use crate::error::FsResult;
use crate::meta::backend::Change;
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
pub(super) fn commit(s: &mut Stm<'_>, changes: &[Change]) -> FsResult<Vec<BlockRow>> {
    let mut gone = Vec::new();
    for c in changes {
        match c {
            Change::PutBlock(b) => put_block(s, b)?,
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

/// Whether block `block_id` is recorded with a replica on datanode `dn`:
/// through the `bid/` index, checked against the row itself (an index key
/// may outlive its row for a moment, see `Stm::delete_later`).
pub(super) fn block_on(s: &mut Stm<'_>, block_id: u64, dn: usize) -> FsResult<bool> {
    let Some(at) = s.get_json::<BlockAt>(&block_index_key(block_id))? else {
        return Ok(false);
    };
    let row: Option<BlockRow> = s.get_json(&block_key(at.ino, at.idx))?;
    Ok(row.is_some_and(|r| r.block_id == block_id && r.replicas.contains(&dn)))
}
