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

use super::ctx::StreamCtx;
use crate::error::{FsError, FsResult};
use crate::meta::{BlockRow, Change, DnId};
use crate::metrics::Fast;
use crate::storage::Storage;
use crate::sync::Arc;

pub(crate) use super::ledger::Replica;

/// One file's (or one replica's) part of an fsync.
pub(crate) type SyncTask = Box<dyn FnOnce() -> FsResult<()> + Send>;

/// The outcome of a sync job for what it covered: a replica, or (`None`)
/// the metadata store.
pub(crate) struct Synced {
    pub who: Option<Replica>,
    pub result: FsResult<()>,
    /// The result is a `syncfs`'s, whose error may be anybody's on that
    /// filesystem: the replica's own syncs tell. Every other error is the
    /// replica's.
    pub shared: bool,
}

impl Synced {
    /// The outcome of the replica's own sync.
    pub fn own(who: Replica, result: FsResult<()>) -> Synced {
        Synced {
            who: Some(who),
            result,
            shared: false,
        }
    }
}

/// Independent work of an fsync, run in parallel with the others.
pub(crate) type SyncJob = Box<dyn FnOnce() -> Vec<Synced> + Send>;

/// How each replica's sync went.
pub(crate) struct ReplicaResult {
    pub replica: Replica,
    pub result: FsResult<()>,
}

/// A replica of a block whose sync failed, and why.
struct Failed<'a> {
    dn: DnId,
    error: &'a FsError,
}

/// The replicas on one datanode filesystem, synced with one `syncfs`.
struct FsGroup {
    node: Arc<dyn Storage>,
    members: Vec<Replica>,
}

/// Wraps one replica's task as a job.
pub(crate) fn job(who: Replica, t: SyncTask) -> SyncJob {
    Box::new(move || vec![Synced::own(who, t())])
}

/// The per-file syncs of a closed replica (data, checksums, directories).
pub(crate) fn closed_replica_syncs(ctx: &StreamCtx, who: Replica, gs: u64) -> Vec<SyncJob> {
    let Some(node) = ctx.dns.get(who.dn) else {
        return Vec::new();
    };
    vec![job(
        who,
        Box::new(move || node.sync_replica(who.block, gs).map_err(FsError::from)),
    )]
}

/// Syncs `replicas` and the metadata store (when it has commits not yet
/// durable), all in parallel with `extra` jobs and with `here`, which runs
/// on the calling thread; `per_file` gives the per-file syncs of one
/// replica (used where syncfs cannot be). Returns each replica's result;
/// fails only if the metadata store could not be synced. When there is
/// nothing but `here` to run, no other thread is involved.
pub(crate) fn sync_replicas(
    ctx: &StreamCtx,
    mut replicas: Vec<Replica>,
    per_file: impl Fn(Replica) -> FsResult<Vec<SyncJob>>,
    extra: Vec<SyncJob>,
    here: impl FnOnce() -> Vec<Synced>,
) -> FsResult<Vec<ReplicaResult>> {
    let mut seen = HashSet::new();
    replicas.retain(|r| seen.insert(*r));
    let mut results: Vec<ReplicaResult> = Vec::new();
    // A replica whose sync failed before is not synced again: a second
    // sync would find its pages clean and succeed.
    replicas.retain(|r| {
        let failed = ctx.ledger.has_failed(r);
        if failed {
            results.push(ReplicaResult {
                replica: *r,
                result: Err(FsError::Io("an earlier sync of this replica failed".into())),
            });
        }
        !failed
    });
    // Replicas a datanode held in memory (the block journal's) go to
    // disk before anything syncs them; one that cannot be written failed
    // as a failed sync does.
    replicas.retain(|r| {
        let Some(node) = ctx.dns.get(r.dn) else {
            return true;
        };
        match node.write_out(r.block) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(datanode = %r.dn, "cannot write replica of block {}: {e}", r.block);
                ctx.dns.mark_failed(r.dn, &e);
                results.push(ReplicaResult {
                    replica: *r,
                    result: Err(FsError::from(e)),
                });
                false
            }
        }
    });
    let mut jobs: Vec<SyncJob> = Vec::new();
    jobs.extend(extra);
    let mut groups: Vec<FsGroup> = Vec::new();
    for who in replicas {
        // A filesystem whose syncfs failed is synced file by file (see
        // `fs_sync`).
        let by_fs = ctx.dns.get(who.dn).filter(|n| {
            ctx.sync_by_fs && n.syncfs_is_barrier() && !ctx.dns.fs_syncs.of(n.fs_id()).failed()
        });
        match by_fs {
            Some(node) => match groups.iter_mut().find(|g| g.node.fs_id() == node.fs_id()) {
                Some(g) => g.members.push(who),
                None => groups.push(FsGroup {
                    node,
                    members: vec![who],
                }),
            },
            None => jobs.extend(per_file(who)?),
        }
    }
    // The metadata store's commits: by a replica's `syncfs` when the
    // store's WAL is on that filesystem (one device flush for both),
    // else by a sync of their own, in parallel with the replicas'.
    let mut meta_by_fs = if ctx.meta.sync_pending() {
        match ctx.meta.commits_on_fs() {
            Some((dev, commits)) if groups.iter().any(|g| g.node.fs_id() == dev) => {
                Some((dev, commits))
            }
            _ => {
                let meta = ctx.meta.clone();
                jobs.push(Box::new(move || {
                    vec![Synced {
                        who: None,
                        result: meta.sync_if_needed(),
                        shared: false,
                    }]
                }));
                None
            }
        }
    } else {
        None
    };
    for FsGroup { node, members } in groups {
        let group = ctx.dns.fs_syncs.of(node.fs_id());
        let meta = meta_by_fs
            .take_if(|(dev, _)| *dev == node.fs_id())
            .map(|(_, commits)| (ctx.meta.clone(), commits));
        jobs.push(Box::new(move || {
            let r = group
                .run(|| node.sync_fs().map_err(FsError::from))
                .map(|joined| {
                    if joined {
                        node.io().fast(Fast::SyncfsShared);
                    }
                });
            if let Err(e) = &r {
                tracing::warn!(
                    datanode = %node.id(),
                    "syncfs failed, syncing file by file: {e}"
                );
            }
            let mut out: Vec<Synced> = members
                .into_iter()
                .map(|w| Synced {
                    who: Some(w),
                    result: r.clone(),
                    shared: true,
                })
                .collect();
            if let Some((meta, commits)) = meta {
                // The syncfs began after the commits were counted. Its
                // error may be anyone's: the store's own sync then tells.
                let result = match &r {
                    Ok(()) => {
                        meta.synced_by_fs(commits);
                        node.io().fast(Fast::WalBySyncfs);
                        Ok(())
                    }
                    Err(_) => meta.sync_if_needed(),
                };
                out.push(Synced {
                    who: None,
                    result,
                    shared: false,
                });
            }
            out
        }));
    }
    let mut again: Vec<SyncJob> = Vec::new();
    // Several jobs of one replica (data, checksums, directory): it fails if
    // any fails.
    let merge = |results: &mut Vec<ReplicaResult>, w: Replica, r: FsResult<()>| match results
        .iter_mut()
        .find(|x| x.replica == w)
    {
        Some(prev) => {
            if prev.result.is_ok() {
                prev.result = r
            }
        }
        None => results.push(ReplicaResult {
            replica: w,
            result: r,
        }),
    };
    for Synced {
        who,
        result,
        shared,
    } in run_parallel(&ctx.rt, jobs, here)
    {
        match (who, result) {
            (None, r) => r?,
            // A syncfs error may be anyone's on that filesystem: the
            // replica's own syncs tell. (Any other error is the replica's,
            // and final: a ranged sync, a cache flush or the start of a
            // sync that failed is never retried into a success.)
            (Some(w), Err(e)) if shared => {
                let own = per_file(w)?;
                if own.is_empty() {
                    merge(&mut results, w, Err(e));
                } else {
                    again.extend(own);
                }
            }
            (Some(w), r) => merge(&mut results, w, r),
        }
    }
    if !again.is_empty() {
        for Synced { who, result, .. } in run_parallel(&ctx.rt, again, Vec::new) {
            if let Some(w) = who {
                merge(&mut results, w, result);
            }
        }
    }
    Ok(results)
}

/// Takes replicas whose sync failed out of their blocks' lists; returns
/// the changed rows (to be recorded durably) or fails, with the first
/// failure's errno, when a block keeps no replica that synced (then its
/// list stays as it was, and the ledger remembers that those replicas
/// failed).
pub(crate) fn drop_failed(
    ctx: &StreamCtx,
    ino: u64,
    rows: &mut [BlockRow],
    results: &[ReplicaResult],
) -> FsResult<Vec<BlockRow>> {
    let mut changed = Vec::new();
    for row in rows.iter_mut() {
        let failed: Vec<Failed<'_>> = results
            .iter()
            .filter_map(|x| match &x.result {
                Err(error)
                    if x.replica.block == row.block_id && row.replicas.contains(&x.replica.dn) =>
                {
                    Some(Failed {
                        dn: x.replica.dn,
                        error,
                    })
                }
                _ => None,
            })
            .collect();
        if failed.is_empty() {
            continue;
        }
        for Failed { dn, error } in &failed {
            tracing::warn!(
                ino,
                block = row.block_id,
                datanode = %dn,
                "replica sync failed; the replica leaves the block: {error}"
            );
            ctx.bad.report(row.block_id, *dn);
            if let Some(node) = ctx.dns.get(*dn) {
                node.io().error();
            }
            ctx.dns.mark_dead(*dn);
        }
        // Every replica failed, or every shared one (a host's copies do
        // not keep a block: they count toward nothing).
        let lost = |d: &DnId| failed.iter().any(|f| f.dn == *d);
        let shared_lost = ctx.dns.any_shared(&row.replicas)
            && row
                .replicas
                .iter()
                .filter(|d| !ctx.dns.is_copy(**d))
                .all(lost);
        if row.replicas.iter().all(lost) || shared_lost {
            ctx.ledger.failed(failed.iter().map(|f| Replica {
                block: row.block_id,
                dn: f.dn,
            }));
            let first = failed[0].error;
            return Err(FsError::Storage(
                format!(
                    "no replica of block {} could be synced: {first}",
                    row.block_id
                ),
                first.errno(),
            ));
        }
        row.replicas.retain(|d| !failed.iter().any(|f| f.dn == *d));
        for f in &failed {
            ctx.ledger.left(&Replica {
                block: row.block_id,
                dn: f.dn,
            });
        }
        changed.push(row.clone());
    }
    Ok(changed)
}

/// The replicas `rows` list, for [`sync_replicas`].
pub(crate) fn replicas_of(rows: &[BlockRow]) -> impl Iterator<Item = Replica> + '_ {
    rows.iter().flat_map(|r| {
        r.replicas.iter().map(|&dn| Replica {
            block: r.block_id,
            dn,
        })
    })
}

/// fsync of a file that no stream of this daemon is writing: every
/// replica of its blocks not known durable (see [`super::ledger`]), and
/// the metadata store.
pub fn sync_file(ctx: &StreamCtx, ino: u64) -> FsResult<()> {
    let mut rows = ctx.meta.blocks(ino)?;
    let replicas = ctx.ledger.to_sync(ino, &rows);
    if replicas.is_empty() {
        return ctx.meta.sync_if_needed();
    }
    let gs_of = |block: u64| rows.iter().find(|r| r.block_id == block).map(|r| r.gs);
    let per_file = |who: Replica| {
        Ok(gs_of(who.block)
            .map(|gs| closed_replica_syncs(ctx, who, gs))
            .unwrap_or_default())
    };
    let results = sync_replicas(ctx, replicas, per_file, Vec::new(), Vec::new)?;
    let changed = drop_failed(ctx, ino, &mut rows, &results)?;
    if !changed.is_empty() {
        let ch: Vec<Change> = changed.into_iter().map(Change::PutBlock).collect();
        ctx.meta.commit(&ch, true)?;
    }
    ctx.ledger.synced(ino, &rows);
    Ok(())
}

/// Runs independent jobs on the blocking pool (reused threads, so an fsync
/// costs no thread creation) and `here` on the calling thread meanwhile,
/// then there too the last job and any other the pool has not started
/// ([`super::helping`]: one hand-off fewer, as the usual fsync has `here`
/// or one job, seldom both; and no wait for a job no thread took);
/// returns every result, a lost job's as a failed sync.
fn run_parallel(
    rt: &tokio::runtime::Handle,
    jobs: Vec<SyncJob>,
    here: impl FnOnce() -> Vec<Synced>,
) -> Vec<Synced> {
    let n = jobs.len();
    let (mut out, done) = super::helping::run_all_beside(rt, jobs, here);
    // A job that panicked reported nothing: its syncs failed.
    for _ in done.len()..n {
        out.push(Synced {
            who: None,
            result: Err(FsError::Io("sync task lost".into())),
            shared: false,
        });
    }
    out.extend(done.into_iter().flat_map(|(_, r)| r));
    out
}
