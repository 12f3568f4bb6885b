//! Making a file durable (`fsync`): every replica of every block the file
//! lists, their checksums and directory entries, and the metadata store,
//! synced in parallel. Shared by the stream of a file being written (which
//! adds the replicas it has open) and by `fsync` through a descriptor that
//! wrote nothing: POSIX makes any descriptor's fsync cover all the file's
//! written data, whoever wrote it and whenever.
//!
//! How a replica is synced: with `replica_sync=fs` one `syncfs(2)` per
//! datanode filesystem covers all replicas there, except on filesystems
//! where syncfs is no barrier (FUSE) and after a syncfs error (which may be
//! anybody's on that filesystem): then each replica's files are synced.
//! A replica whose sync fails leaves its block's replica list (durably)
//! before the fsync returns, so that recovery never counts a replica that
//! may not hold what the fsync promised; the fsync fails only when no
//! replica of a block could be synced.

use std::collections::HashSet;

use super::stream::StreamCtx;
use crate::error::{FsError, FsResult};
use crate::meta::{BlockRow, Change, DnId};
use crate::storage::datanode::Datanode;
use crate::sync::{Arc, lock};

/// A replica: (block id, datanode id).
pub(crate) type Replica = (u64, DnId);
/// One file's (or one replica's) part of an fsync.
pub(crate) type SyncTask = Box<dyn FnOnce() -> FsResult<()> + Send>;
/// A job's result for each replica it covers (`None`: the metadata store).
pub(crate) type SyncResult = (Option<Replica>, FsResult<()>);
/// Independent work of an fsync, run in parallel with the others.
pub(crate) type SyncJob = Box<dyn FnOnce() -> Vec<SyncResult> + Send>;

/// Wraps one replica's task as a job.
pub(crate) fn job(who: Replica, t: SyncTask) -> SyncJob {
    Box::new(move || vec![(Some(who), t())])
}

/// The per-file syncs of a closed replica (data, checksums, directories).
pub(crate) fn closed_replica_syncs(ctx: &StreamCtx, who: Replica, gs: u64) -> Vec<SyncJob> {
    let Some(node) = ctx.dns.get(who.1) else {
        return Vec::new();
    };
    vec![job(
        who,
        Box::new(move || node.sync_replica(who.0, gs).map_err(FsError::from)),
    )]
}

/// Syncs `replicas` and the metadata store, all in parallel; `per_file`
/// gives the per-file syncs of one replica (used where syncfs cannot be).
/// Returns each replica's result; fails only if the metadata store could
/// not be synced.
pub(crate) fn sync_replicas(
    ctx: &StreamCtx,
    mut replicas: Vec<Replica>,
    per_file: impl Fn(Replica) -> FsResult<Vec<SyncJob>>,
) -> FsResult<Vec<(Replica, FsResult<()>)>> {
    let mut seen = HashSet::new();
    replicas.retain(|r| seen.insert(*r));
    let meta = ctx.meta.clone();
    // The store's sync is first: `run_parallel` runs the last job on this
    // thread, and that should be a replica's (the store's is usually a
    // no-op).
    let mut jobs: Vec<SyncJob> = vec![Box::new(move || vec![(None, meta.sync_if_needed())])];
    let mut groups: Vec<(Arc<Datanode>, Vec<Replica>)> = Vec::new();
    for who in replicas {
        let by_fs = ctx
            .dns
            .get(who.1)
            .filter(|n| ctx.sync_by_fs && n.syncfs_is_barrier());
        match by_fs {
            Some(node) => match groups.iter_mut().find(|g| g.0.fs_id() == node.fs_id()) {
                Some(g) => g.1.push(who),
                None => groups.push((node.clone(), vec![who])),
            },
            None => jobs.extend(per_file(who)?),
        }
    }
    for (node, members) in groups {
        jobs.push(Box::new(move || {
            let r = node.sync_fs().map_err(FsError::from);
            if let Err(e) = &r {
                tracing::warn!(
                    datanode = %node.id,
                    "syncfs failed, syncing file by file: {e}"
                );
            }
            members.into_iter().map(|w| (Some(w), r.clone())).collect()
        }));
    }
    let mut results: Vec<(Replica, FsResult<()>)> = Vec::new();
    let mut again: Vec<SyncJob> = Vec::new();
    // Several jobs of one replica (data, checksums, directory): it fails if
    // any fails.
    let merge =
        |results: &mut Vec<(Replica, FsResult<()>)>, w: Replica, r: FsResult<()>| match results
            .iter_mut()
            .find(|(x, _)| *x == w)
        {
            Some((_, prev)) => {
                if prev.is_ok() {
                    *prev = r
                }
            }
            None => results.push((w, r)),
        };
    for (who, r) in run_parallel(&ctx.rt, jobs) {
        match (who, r) {
            (None, r) => r?,
            // A syncfs error may be anyone's on that filesystem: the
            // replica's own syncs tell.
            (Some(w), Err(_)) if ctx.sync_by_fs && ctx.dns.get(w.1).is_some() => {
                again.extend(per_file(w)?)
            }
            (Some(w), r) => merge(&mut results, w, r),
        }
    }
    if !again.is_empty() {
        for (who, r) in run_parallel(&ctx.rt, again) {
            if let Some(w) = who {
                merge(&mut results, w, r);
            }
        }
    }
    Ok(results)
}

/// Takes replicas whose sync failed out of their blocks' lists; returns
/// the changed rows (to be committed durably) or fails when a block keeps
/// no replica that synced.
pub(crate) fn drop_failed(
    ctx: &StreamCtx,
    ino: u64,
    rows: &mut [BlockRow],
    results: &[(Replica, FsResult<()>)],
) -> FsResult<Vec<BlockRow>> {
    let mut changed = Vec::new();
    for row in rows.iter_mut() {
        let failed: Vec<(DnId, &FsError)> = results
            .iter()
            .filter_map(|((b, dn), r)| match r {
                Err(e) if *b == row.block_id => Some((*dn, e)),
                _ => None,
            })
            .collect();
        if failed.is_empty() {
            continue;
        }
        for (dn, e) in &failed {
            tracing::warn!(
                ino,
                block = row.block_id,
                datanode = %dn,
                "replica sync failed; the replica leaves the block: {e}"
            );
            ctx.bad.report(row.block_id, *dn);
            if let Some(node) = ctx.dns.get(*dn) {
                node.io.error();
            }
            ctx.dns.mark_dead(*dn);
        }
        row.replicas.retain(|d| !failed.iter().any(|(f, _)| f == d));
        if row.replicas.is_empty() {
            return Err(FsError::Io(format!(
                "no replica of block {} could be synced: {}",
                row.block_id, failed[0].1
            )));
        }
        changed.push(row.clone());
    }
    Ok(changed)
}

/// fsync of a file that no stream of this daemon is writing: every
/// replica of its blocks (unless all were synced since the daemon started
/// and nothing changed since) and the metadata store.
pub fn sync_file(ctx: &StreamCtx, ino: u64) -> FsResult<()> {
    if lock(&ctx.synced_files).contains(&ino) {
        return ctx.meta.sync_if_needed();
    }
    let mut rows = ctx.meta.blocks(ino)?;
    let replicas: Vec<Replica> = rows
        .iter()
        .flat_map(|r| r.replicas.iter().map(|dn| (r.block_id, *dn)))
        .collect();
    let gs_of = |block: u64| rows.iter().find(|r| r.block_id == block).map(|r| r.gs);
    let results = sync_replicas(ctx, replicas, |who| {
        Ok(gs_of(who.0)
            .map(|gs| closed_replica_syncs(ctx, who, gs))
            .unwrap_or_default())
    })?;
    let changed = drop_failed(ctx, ino, &mut rows, &results)?;
    if !changed.is_empty() {
        let ch: Vec<Change> = changed.into_iter().map(Change::PutBlock).collect();
        ctx.meta.commit(&ch, true)?;
    }
    lock(&ctx.synced_files).insert(ino);
    Ok(())
}

/// Runs independent jobs on the blocking pool (reused threads, so an fsync
/// costs no thread creation), the last one on the calling thread; returns
/// every result.
fn run_parallel(rt: &tokio::runtime::Handle, mut jobs: Vec<SyncJob>) -> Vec<SyncResult> {
    let Some(last) = jobs.pop() else {
        return Vec::new();
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let n = jobs.len();
    for job in jobs {
        let tx = tx.clone();
        rt.spawn_blocking(move || {
            let _ = tx.send(job());
        });
    }
    drop(tx);
    let mut out = last();
    for _ in 0..n {
        match rx.recv() {
            Ok(r) => out.extend(r),
            Err(_) => out.push((None, Err(FsError::Io("sync task lost".into())))),
        }
    }
    out
}
