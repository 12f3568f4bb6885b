//! The block journal: a small file's fsync made durable by one `fdatasync`
//! of the metadata store's WAL instead of a sync of its replicas.
//!
//! Why. A durable small file is one `create + write + fsync`; its cost is
//! the device's flushes, not its bytes. Syncing the replicas (`syncfs`:
//! the files' write-back, the filesystem's metadata, the flush, and
//! whatever else that filesystem has dirty) and then the WAL costs about
//! twice what one `fdatasync` of a log costs (benches/PROFILE.md). So the
//! commit that records a small block written whole at its fsync also
//! records its bytes ([`Change::Journal`]), and the WAL's sync makes both
//! durable at once. The replicas are not written then: each datanode
//! holds them in memory (`storage::deferred`) until something needs
//! them on disk, at the latest a checkpoint shortly after, which writes
//! and syncs them in batches (one `syncfs` per datanode filesystem for
//! every file of the window: concurrent writers share it) and forgets
//! the rows.
//!
//! A small file closed without an fsync takes the same path (its close's
//! commit keeps the bytes, unsynced): at R=3 its close then creates no
//! replica file (six of them before: data and checksums, three times),
//! and the checkpoint's thread does that work beside the writer.
//!
//! The rules that keep it safe (docs/SEMANTICS.md, "The block journal"):
//! - a row is forgotten only after a sync of every replica its block
//!   lists succeeded (a failed one leaves the block as any failed sync
//!   does; if none is left, the row stays until the next mount);
//! - nothing changes a journaled replica in place (an append reopening
//!   the block, a truncation cutting it) before [`settle`] synced it;
//! - at mount, before anything else reads or repairs a replica,
//!   [`replay`] checks every replica a row's block lists against the
//!   row's bytes, rewrites those that differ or are missing, syncs them,
//!   and forgets the row. A row whose block is gone, or carries another
//!   stamp or length, is forgotten: its bytes were superseded by a
//!   durable change, which settled the replicas first.
//!
//! Only where the store [journals](crate::meta::BlockMap::journals) (one
//! daemon's SQLite); over etcd the commit is durable elsewhere already.

use std::collections::HashMap;
use std::sync::Weak;

use super::ctx::StreamCtx;
use super::datanodes::Datanodes;
use super::durable::{self, closed_replica_syncs};
use crate::error::{FsError, FsResult};
use crate::meta::{BlockRow, Change, Meta};
use crate::metrics::Fast;
use crate::storage::checksum::chunk_crcs;
use crate::sync::{Arc, Ordering, lock};

pub(crate) mod set;

pub use set::{CHECKPOINT_AFTER, Journal};

/// `row` was committed with its bytes: its replicas wait for a
/// checkpoint, which this schedules (unless one is).
pub(crate) fn add(ctx: &Arc<StreamCtx>, row: &BlockRow) {
    for dn in &row.replicas {
        if let Some(node) = ctx.dns.get(*dn) {
            node.io().fast(Fast::Journaled);
        }
    }
    if ctx.journal.note(row.block_id) {
        let weak = Arc::downgrade(ctx);
        let journal = Arc::clone(&ctx.journal);
        // A pool thread that waits: no timer needed of the runtime.
        ctx.rt.spawn_blocking(move || {
            journal.wait_window();
            checkpoint_later(weak)
        });
    }
}

/// The commit that was to record `row` (with its bytes or not) failed, so
/// whether it is on disk is not known: every replica a datanode holds of
/// it goes to disk (no sweep deletes them before the metadata says
/// whether a block needs them).
pub(crate) fn write_out(ctx: &StreamCtx, row: &BlockRow) {
    for dn in &row.replicas {
        if let Some(node) = ctx.dns.get(*dn) {
            let _ = node.write_out(row.block_id);
        }
    }
}

fn checkpoint_later(ctx: Weak<StreamCtx>) {
    let Some(ctx) = ctx.upgrade() else { return };
    // Blocks added from now on schedule the next checkpoint.
    ctx.journal.scheduled.store(false, Ordering::Release);
    #[cfg(test)]
    if ctx.journal.held.load(Ordering::Acquire) {
        return;
    }
    if let Err(e) = checkpoint(&ctx) {
        tracing::warn!("block journal checkpoint: {e}");
    }
}

/// Syncs the replicas of every block journaled so far and forgets their
/// rows; returns how many were forgotten.
pub fn checkpoint(ctx: &StreamCtx) -> FsResult<usize> {
    let _one = lock(&ctx.journal.running);
    let ids: Vec<u64> = lock(&ctx.journal.pending).iter().copied().collect();
    sync_and_forget(ctx, &ids)
}

/// Before block `block_id`'s replicas change in place: if it is
/// journaled, its replicas are synced (and its row forgotten) first, so
/// that no durable change can supersede a row whose bytes no replica
/// holds on disk. Fails where that cannot be (every replica failed its
/// sync): the change must not happen.
pub(crate) fn settle(ctx: &StreamCtx, block_id: u64) -> FsResult<()> {
    if lock(&ctx.journal.stuck).contains(&block_id) {
        return Err(FsError::Io(format!(
            "block {block_id} is kept by the journal only (no replica could be synced); it cannot change until the daemon restarts"
        )));
    }
    {
        // After a checkpoint under way: it may be syncing this block.
        let _one = lock(&ctx.journal.running);
        if !lock(&ctx.journal.pending).contains(&block_id) {
            return Ok(());
        }
        sync_and_forget(ctx, &[block_id])?;
    }
    if lock(&ctx.journal.stuck).contains(&block_id) {
        return Err(FsError::Io(format!(
            "no replica of block {block_id} could be synced; the journal keeps its bytes until the daemon restarts"
        )));
    }
    Ok(())
}

/// The checkpoint of `ids` (the caller holds `journal.running`): their
/// current rows' replicas synced (one
/// `syncfs` per filesystem where that is a barrier, as an fsync's), the
/// failed ones out of their blocks, and the journal rows forgotten.
fn sync_and_forget(ctx: &StreamCtx, ids: &[u64]) -> FsResult<usize> {
    if ids.is_empty() {
        return Ok(0);
    }
    let mut rows = Vec::new();
    let mut gone = Vec::new();
    for &id in ids {
        match ctx.meta.block_by_id(id)? {
            Some(r) => rows.push(r),
            None => gone.push(id),
        }
    }
    let gs_of: HashMap<u64, u64> = rows.iter().map(|r| (r.block_id, r.gs)).collect();
    let per_file = |who: durable::Replica| {
        Ok(gs_of
            .get(&who.block)
            .map(|&gs| closed_replica_syncs(ctx, who, gs))
            .unwrap_or_default())
    };
    let replicas = durable::replicas_of(&rows).collect();
    let results = durable::sync_replicas(ctx, replicas, per_file, Vec::new(), Vec::new)?;
    // Rows whose replicas all synced, and those that lost a replica.
    let mut clean = gone;
    let mut dropped: Vec<(u64, Change)> = Vec::new();
    for row in rows {
        // Deleted meanwhile: its replicas went after the durable metadata
        // that dropped it, so a sync that found none failed no datanode.
        if ctx.meta.block_by_id(row.block_id)?.is_none() {
            clean.push(row.block_id);
            continue;
        }
        let expect = row.clone();
        let mut one = [row];
        match durable::drop_failed(ctx, expect.ino, &mut one, &results) {
            Ok(changed) if changed.is_empty() => clean.push(expect.block_id),
            Ok(mut changed) => {
                let row = changed.remove(0);
                let id = expect.block_id;
                dropped.push((id, Change::PutBlockIf { expect, row }));
            }
            // Deleted meanwhile (its replicas with it): nothing to keep.
            Err(_) if ctx.meta.block_by_id(expect.block_id)?.is_none() => {
                clean.push(expect.block_id)
            }
            Err(e) => {
                tracing::error!(
                    block = expect.block_id,
                    "no replica of a journaled block could be synced; the journal keeps its bytes until the next mount: {e}"
                );
                // Stuck before it leaves the pending set: `settle` never
                // finds it in neither.
                lock(&ctx.journal.stuck).insert(expect.block_id);
                lock(&ctx.journal.pending).remove(&expect.block_id);
            }
        }
    }
    let mut changes: Vec<Change> = clean.iter().map(|&id| Change::Unjournal(id)).collect();
    for (id, c) in &dropped {
        changes.push(c.clone());
        changes.push(Change::Unjournal(*id));
    }
    let done = match ctx.meta.commit(&changes, false) {
        Ok(_) => clean
            .into_iter()
            .chain(dropped.into_iter().map(|(id, _)| id))
            .collect(),
        // A replica list changed meanwhile (the balancer): the blocks that
        // lost a replica stay for the next checkpoint, which reads their
        // rows again.
        Err(e) => {
            tracing::debug!("journal checkpoint: {e}; forgetting the clean rows only");
            let only: Vec<Change> = clean.iter().map(|&id| Change::Unjournal(id)).collect();
            ctx.meta.commit(&only, false)?;
            clean
        }
    };
    let mut pending = lock(&ctx.journal.pending);
    for id in &done {
        pending.remove(id);
    }
    Ok(done.len())
}

/// What [`replay`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Replayed {
    /// Rows found.
    pub rows: usize,
    /// Replicas rewritten from their rows (missing or not the row's bytes).
    pub rewritten: usize,
    /// Rows kept (blocks): a replica could not be checked, rewritten or
    /// synced. The next mount replays them again; until then nothing may
    /// change them in place ([`Journal::keep`]).
    pub kept: Vec<u64>,
}

/// At mount (and in an offline fsck that repairs), before anything else
/// reads, moves or repairs a replica: every journaled block's replicas
/// made to hold the row's bytes, durably; the rows then forgotten.
pub fn replay(meta: &dyn Meta, dns: &Datanodes) -> FsResult<Replayed> {
    let rows = meta.journal_rows()?;
    let mut out = Replayed {
        rows: rows.len(),
        ..Replayed::default()
    };
    let mut forget = Vec::new();
    // Replicas to sync, by datanode; synced per filesystem below.
    let mut touched: Vec<(crate::meta::DnId, u64, u64)> = Vec::new();
    let mut kept = Vec::new();
    for j in rows {
        let block = meta.block_by_id(j.block_id)?;
        let Some(b) = block.filter(|b| b.gs == j.gs && b.len == j.data.len() as u64) else {
            forget.push(j.block_id);
            continue;
        };
        let mut ok = true;
        for &dn in &b.replicas {
            let Some(node) = dns.get(dn) else {
                ok = false;
                continue;
            };
            let mut buf = vec![0u8; j.data.len()];
            let same = node
                .read(b.block_id, b.gs, 0, &mut buf)
                .is_ok_and(|n| n == buf.len() && buf == j.data);
            if !same {
                let mut crcs = Vec::new();
                chunk_crcs(&j.data, &mut crcs);
                let _ = node.delete(b.block_id);
                match node.write_finalized(b.block_id, b.gs, &j.data, &crcs) {
                    Ok(()) => {
                        out.rewritten += 1;
                        node.io().fast(Fast::JournalReplayed);
                        tracing::info!(block = b.block_id, datanode = %dn, "replica rewritten from the block journal");
                    }
                    Err(e) => {
                        tracing::error!(block = b.block_id, datanode = %dn, "cannot rewrite a replica from the block journal: {e}");
                        ok = false;
                        continue;
                    }
                }
            }
            touched.push((dn, b.block_id, b.gs));
        }
        if ok {
            forget.push(j.block_id);
        } else {
            kept.push(j.block_id);
        }
    }
    // A replica that verified may be in the page cache only (the daemon
    // was killed, the machine kept running): every one is synced.
    let mut failed_dns = Vec::new();
    let mut by_fs: HashMap<u64, Arc<dyn crate::storage::Storage>> = HashMap::new();
    for &(dn, block, gs) in &touched {
        let Some(node) = dns.get(dn) else { continue };
        if node.syncfs_is_barrier() {
            by_fs.entry(node.fs_id()).or_insert(node);
        } else if let Err(e) = node.sync_replica(block, gs) {
            tracing::error!(block, datanode = %dn, "cannot sync a replica the block journal checked: {e}");
            failed_dns.push((dn, Some(block)));
        }
    }
    for node in by_fs.values() {
        if let Err(e) = node.sync_fs() {
            tracing::error!(datanode = %node.id(), "cannot sync the replicas the block journal checked: {e}");
            let fs = node.fs_id();
            for &(dn, _, _) in &touched {
                if dns.get(dn).is_some_and(|n| n.fs_id() == fs) {
                    failed_dns.push((dn, None));
                }
            }
        }
    }
    if !failed_dns.is_empty() {
        forget.retain(|id| {
            let hit = touched.iter().any(|&(dn, b, _)| {
                b == *id
                    && failed_dns
                        .iter()
                        .any(|&(f, fb)| f == dn && fb.is_none_or(|fb| fb == b))
            });
            if hit {
                kept.push(*id);
            }
            !hit
        });
    }
    out.kept = kept;
    if !forget.is_empty() {
        let ch: Vec<Change> = forget.into_iter().map(Change::Unjournal).collect();
        meta.commit(&ch, true)?;
    }
    Ok(out)
}
