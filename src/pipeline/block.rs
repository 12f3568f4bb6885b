//! Opening the block a packet goes into (a new one at a block boundary,
//! else the file's last block reopened for append under a new generation
//! stamp) and finalising a block's replicas once it is full or the file is
//! closed.

use super::ctx::StreamFile;
use super::datanodes::FULL_BELOW;
use super::flush_floor::Finalizing;
use super::in_flight::Hold;
use super::outcome::FileOutcome;
use super::pipe::{OpenBlock, ReplicaOut, datanodes_of};
use crate::error::{FsError, FsResult};
use crate::meta::{BlockRow, Counter};
use crate::storage::checksum::{CHUNK_SIZE, chunk_crcs};
use crate::storage::{ChunkAccumulator, Storage, StorageError};

/// A block whose replicas were finalised: its row (the replicas that
/// made it) and the file offset just past it.
pub(crate) struct Finished {
    pub row: BlockRow,
    pub end: u64,
}

/// Opens the block that holds file offset `off`: a new one at a block
/// boundary, else the file's last block reopened for append. `known_new`:
/// no block of that index exists (spares the block-list query).
pub(crate) fn open(f: &StreamFile, off: u64, known_new: bool) -> FsResult<OpenBlock> {
    let bs = f.block_size;
    let idx = off / bs;
    let start = idx * bs;
    let existing = if known_new {
        None
    } else {
        let blocks = f.ctx.meta.blocks(f.ino)?;
        blocks.into_iter().find(|b| b.idx == idx)
    };
    match existing {
        None => open_new(f, idx, start),
        Some(row) => reopen(f, row, start, off - start),
    }
}

/// A new block `idx` of the file on a fresh pipeline, recorded (with the
/// file under construction, the first time) before anything is written.
fn open_new(f: &StreamFile, idx: u64, start: u64) -> FsResult<OpenBlock> {
    let dns = &f.ctx.dns;
    let pipeline = dns.choose_pipeline()?;
    let block_id = f.ctx.meta.alloc(Counter::Block)?;
    let gs = f.ctx.meta.alloc(Counter::GenStamp)?;
    // Until the record below: the replicas exist before any row lists them.
    let _hold = dns.hold(block_id);
    let mut replicas = Vec::new();
    for dn in pipeline {
        let Some(node) = dns.get(dn) else {
            continue;
        };
        match node.create_rbw(block_id, gs) {
            Ok(w) => replicas.push(ReplicaOut { dn, w }),
            Err(e) => {
                tracing::warn!(datanode = %dn, "cannot create replica: {e}");
                dns.mark_failed(dn, &e);
            }
        }
    }
    if !dns.any_shared(&datanodes_of(&replicas)) {
        // A host's copy alone is no block (it counts toward nothing).
        for r in replicas {
            if let Some(node) = dns.get(r.dn) {
                drop(r.w);
                let _ = node.delete(block_id);
            }
        }
        return Err(FsError::Io("no datanode could take a new block".into()));
    }
    let row = BlockRow {
        ino: f.ino,
        idx,
        block_id,
        gs,
        len: 0,
        finalized: false,
        replicas: datanodes_of(&replicas),
    };
    f.log.record(FileOutcome::Opened(&row), false)?;
    Ok(OpenBlock {
        row,
        start,
        replicas,
        acc: ChunkAccumulator::new(),
        synced: false,
    })
}

/// A new block `idx` starting at file offset `start`, written whole:
/// `data` is all it will hold (the last packet of a file being closed or
/// fsynced, and its first; `path` counts which). Each replica goes
/// straight into `finalized/`; a datanode that fails is replaced by a
/// spare where one has room. Nothing is recorded here: the caller records
/// the block in one commit, with the file's close (so the file is never
/// under construction on its account) or as the finished block of the
/// file its fsync makes durable. The block stays in flight (no sweep
/// deletes its replicas) while the returned hold lives: the caller drops
/// it once the commit returned. With `defer` (the commit will journal the
/// bytes) a datanode may keep its replica in memory until it is needed
/// on disk ([`crate::storage::Storage::write_deferred`]).
pub(crate) fn write_whole(
    f: &StreamFile,
    idx: u64,
    data: &[u8],
    crcs: &mut Vec<u32>,
    path: crate::metrics::Fast,
    defer: bool,
) -> FsResult<(BlockRow, Hold)> {
    let dns = &f.ctx.dns;
    let mut tried = dns.choose_pipeline()?;
    let block_id = f.ctx.meta.alloc(Counter::Block)?;
    let gs = f.ctx.meta.alloc(Counter::GenStamp)?;
    let hold = dns.hold(block_id);
    // Written unsynced unless the journal keeps the bytes.
    let floor = (!defer).then(|| f.ctx.floor.finalizing(gs));
    let behind = matches!(floor, Some(Finalizing::Behind));
    crcs.clear();
    chunk_crcs(data, crcs);
    let mut ok = Vec::new();
    let mut todo = tried.clone();
    while let Some(dn) = todo.pop() {
        let Some(node) = dns.get(dn) else { continue };
        let written = if defer {
            node.write_deferred(block_id, gs, data, crcs)
        } else {
            node.write_finalized(block_id, gs, data, crcs)
                .and_then(|()| sync_if_behind(&*node, behind, block_id, gs))
                .map(|()| false)
        };
        match written {
            Ok(kept) => {
                node.io().fast(path);
                if kept {
                    node.io().fast(crate::metrics::Fast::Deferred);
                }
                ok.push(dn)
            }
            Err(e) => {
                tracing::warn!(datanode = %dn, "cannot write replica: {e}");
                dns.mark_failed(dn, &e);
                let room = data.len() as u64 + FULL_BELOW;
                // A failed host copy is not replaced (it counts toward
                // nothing); a shared replica is, by a shared spare.
                let spare = (!dns.is_copy(dn))
                    .then(|| dns.choose_with_room(1, &tried, room).first().copied())
                    .flatten();
                if let Some(spare) = spare {
                    tried.push(spare);
                    todo.push(spare);
                }
            }
        }
    }
    if !dns.any_shared(&ok) {
        for dn in ok {
            if let Some(node) = dns.get(dn) {
                let _ = node.delete(block_id);
            }
        }
        return Err(FsError::Io("no datanode could take a new block".into()));
    }
    ok.reverse();
    let row = BlockRow {
        ino: f.ino,
        idx,
        block_id,
        gs,
        len: data.len() as u64,
        finalized: true,
        replicas: ok,
    };
    Ok((row, hold))
}

/// The file's last block, `len` bytes long, reopened for append under a
/// new generation stamp.
fn reopen(f: &StreamFile, row: BlockRow, start: u64, len: u64) -> FsResult<OpenBlock> {
    let dns = &f.ctx.dns;
    // The partial last chunk, from any replica, before anything changes.
    let tail_start = len - len % CHUNK_SIZE as u64;
    let mut tail = vec![0u8; (len - tail_start) as usize];
    let have_tail = tail.is_empty()
        || row.replicas.iter().any(|&dn| {
            dns.get(dn).is_some_and(|node| {
                node.read(row.block_id, row.gs, tail_start, &mut tail)
                    .is_ok()
            })
        });
    if !have_tail {
        return Err(FsError::Io(format!(
            "no replica of block {} could be read to append to it",
            row.block_id
        )));
    }
    // Changed in place below: a journaled block's bytes go to disk first.
    super::journal::settle(&f.ctx, row.block_id)?;
    // The new stamp, the block as being written and the file as under
    // construction are recorded, durably, before any replica carries the
    // stamp: a replica's stamp may lag what the metadata records (recovery
    // and repair settle it), never lead it (that would make every replica
    // stale).
    let new_gs = f.ctx.meta.alloc(Counter::GenStamp)?;
    let mut rec = row.clone();
    rec.gs = new_gs;
    rec.len = len;
    rec.finalized = false;
    f.log.record(FileOutcome::Opened(&rec), true)?;
    let replicas = reopen_replicas(f, &row, new_gs, len);
    // Another host's copy is not reachable here: it leaves the block (a
    // stale copy its host's sweep removes). Copies alone are no pipeline.
    if !dns.any_shared(&datanodes_of(&replicas)) {
        return Err(FsError::Io(format!(
            "no replica of block {} could be reopened for append",
            row.block_id
        )));
    }
    if replicas.len() < rec.replicas.len() {
        rec.replicas = datanodes_of(&replicas);
        f.log.record(FileOutcome::Opened(&rec), false)?;
    }
    Ok(OpenBlock {
        row: rec,
        start,
        replicas,
        acc: ChunkAccumulator::resume(tail),
        synced: false,
    })
}

/// Moves every replica of `row` to `new_gs` and reopens it at `len`, the
/// datanodes in parallel ([`super::helping`]): each one's renames and
/// syncs (its directories, the saved last chunk) wait for its disk alone,
/// so an append to a closed file waits for the slowest replica, not for
/// their sum. Returns those that reopened, in `row`'s order.
fn reopen_replicas(f: &StreamFile, row: &BlockRow, new_gs: u64, len: u64) -> Vec<ReplicaOut> {
    let (block, old_gs) = (row.block_id, row.gs);
    type Job = Box<dyn FnOnce() -> Option<ReplicaOut> + Send>;
    let jobs: Vec<Job> = row
        .replicas
        .iter()
        .filter_map(|&dn| f.ctx.dns.get(dn).map(|node| (dn, node)))
        .map(|(dn, node)| -> Job {
            Box::new(move || {
                let r = node
                    .bump_gs(block, old_gs, new_gs)
                    .and_then(|_| node.reopen_rbw(block, new_gs, len));
                r.map(|w| ReplicaOut { dn, w })
                    .inspect_err(
                        |e| tracing::warn!(datanode = %dn, "replica not reopened for append: {e}"),
                    )
                    .ok()
            })
        })
        .collect();
    super::helping::run_all(&f.ctx.rt, jobs)
        .into_iter()
        .filter_map(|(_, r)| r)
        .collect()
}

/// Closes the replicas of a block and moves them to `finalized/`; returns
/// its row and the file length it ends at, for the caller to record (with
/// whatever else it records). A block not synced since its last byte
/// joins `unsynced` (closing promises no durability; `fsync` syncs it).
pub(crate) fn finalize(
    f: &StreamFile,
    mut b: OpenBlock,
    unsynced: &mut Vec<u64>,
) -> FsResult<Finished> {
    let len = b.row.len;
    let (block, gs) = (b.row.block_id, b.row.gs);
    let floor = (!b.synced).then(|| f.ctx.floor.finalizing(gs));
    let behind = matches!(floor, Some(Finalizing::Behind));
    let mut ok = Vec::new();
    for ReplicaOut { dn, w } in b.replicas.drain(..) {
        let Some(node) = f.ctx.dns.get(dn) else {
            continue;
        };
        let done = node
            .finalize_written(w, block, gs, len)
            .and_then(|()| sync_if_behind(&*node, behind, block, gs));
        match done {
            Ok(()) => ok.push(dn),
            Err(e) => tracing::warn!(datanode = %dn, "finalize failed: {e}"),
        }
    }
    drop(floor);
    if !f.ctx.dns.any_shared(&ok) {
        return Err(FsError::Io(format!(
            "no replica of block {} finalized",
            b.row.block_id
        )));
    }
    b.row.finalized = true;
    if !b.synced && !behind {
        unsynced.push(b.row.block_id);
    }
    b.row.replicas = ok;
    Ok(Finished {
        row: b.row,
        end: b.start + len,
    })
}

/// Syncs replica `block`@`gs` on `node` when the flush marks may already
/// have passed its stamp (see [`super::flush_floor`]): a block opened
/// before their latest move and finalized after it. A replica that cannot
/// be synced is not recorded, as one that cannot be written.
fn sync_if_behind(
    node: &dyn Storage,
    behind: bool,
    block: u64,
    gs: u64,
) -> Result<(), StorageError> {
    if !behind {
        return Ok(());
    }
    node.sync_replica(block, gs).inspect_err(|e| {
        tracing::error!(block, datanode = %node.id(), "cannot sync a replica finalized behind the flush marks: {e}");
    })?;
    node.io().fast(crate::metrics::Fast::SyncedBehindMark);
    Ok(())
}
