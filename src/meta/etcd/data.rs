//! The write path's commits, the inode deletion that frees blocks, the
//! block index, and the datanode registry.

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

/// The row of block `block_id`: through the `bid/` index, checked
/// against the row itself (an index key may outlive its row for a moment,
/// see `Stm::delete_later`).
pub(super) fn block_by_id(s: &mut Stm<'_>, block_id: u64) -> FsResult<Option<BlockRow>> {
    let Some(at) = s.get_json::<BlockAt>(&block_index_key(block_id))? else {
        return Ok(None);
    };
    let row: Option<BlockRow> = s.get_json(&block_key(at.ino, at.idx))?;
    Ok(row.filter(|r| r.block_id == block_id))
}

/// Turns the positional layout's datanode list into registry records:
/// each keeps its place as its id and awaits an identity file.
pub(super) fn upgrade_positional_datanodes(s: &mut Stm<'_>) -> FsResult<()> {
    let Some(old) = s.get_json::<PositionalDatanodes>(POSITIONAL_DATANODES)? else {
        return Ok(());
    };
    for (i, dir) in old.dirs.iter().enumerate() {
        let id = DnId(i as u32);
        if s.get(&datanode_key(id))?.is_none() {
            let rec = DatanodeRecord {
                id,
                storage_id: None,
                path: dir.into(),
                state: AdminState::Upgrading,
            };
            s.put_json(&datanode_key(id), &rec)?;
        }
    }
    if let Some(r) = old.replication
        && s.counter(REPLICATION)?.is_none()
    {
        s.set_counter(REPLICATION, r as u64);
    }
    s.delete(POSITIONAL_DATANODES);
    Ok(())
}

/// The counter holding the replication factor of the last mount.
pub(super) const REPLICATION: &str = "replication";

/// [`crate::meta::Meta::register_datanode`] in one attempt.
pub(super) fn register_datanode(
    s: &mut Stm<'_>,
    storage_id: &str,
    path: &std::path::Path,
) -> FsResult<DnId> {
    let all: Vec<DatanodeRecord> = s
        .scan_json(DATANODES)?
        .into_iter()
        .map(|(_, r)| r)
        .collect();
    let mut rec = match all
        .iter()
        .find(|r| r.storage_id.as_deref() == Some(storage_id))
    {
        Some(r) => r.clone(),
        None => DatanodeRecord {
            id: DnId(all.iter().map(|r| r.id.0 + 1).max().unwrap_or(0)),
            storage_id: Some(storage_id.to_string()),
            path: path.to_path_buf(),
            state: AdminState::Normal,
        },
    };
    rec.path = path.to_path_buf();
    if rec.state == AdminState::Upgrading {
        rec.state = AdminState::Normal;
    }
    s.put_json(&datanode_key(rec.id), &rec)?;
    Ok(rec.id)
}

/// [`crate::meta::Meta::claim_legacy_datanode`] in one attempt.
pub(super) fn claim_legacy_datanode(
    s: &mut Stm<'_>,
    id: DnId,
    storage_id: &str,
) -> FsResult<String> {
    let key = datanode_key(id);
    let mut rec: DatanodeRecord = s
        .get_json(&key)?
        .ok_or_else(|| crate::error::FsError::Meta(format!("datanode {id} is not recorded")))?;
    if let Some(sid) = &rec.storage_id {
        return Ok(sid.clone());
    }
    rec.storage_id = Some(storage_id.to_string());
    s.put_json(&key, &rec)?;
    Ok(storage_id.to_string())
}
