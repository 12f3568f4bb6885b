//! What a crash may have torn, found at the next mount.
//!
//! A file closed without an `fsync` is recorded finished while its
//! replicas' last pages may not be on their disks yet. A power cut can
//! then leave one replica torn inside while its siblings are whole: the
//! file reads right (a reader skips a replica whose checksums fail), but
//! its block counts a replica it does not have, until someone happens to
//! read that one (tests/powercut_rounds.rs found such a block after a cut
//! that came just after a `close`). Reading every checksum of every
//! replica at mount would cost R times the data, so each datanode keeps
//! a flush mark (`storage::flushed`): replicas of a lower generation stamp
//! are on its disk. At mount the replicas at or above it are synced (the
//! machine may have kept running while the daemon died) and given to
//! housekeeping as suspects, whose first round reads their checksums and
//! repairs those that fail, as it does for a replica a reader reported.
//! Once all were checked, the mark moves up to a stamp allocated after
//! that sync. From then on it moves after every housekeeping round in
//! which anything was written: a stamp is taken, every datanode synced,
//! and the mark set to that stamp, or below a replica whose finalizing
//! was under way when it was taken (`pipeline::flush_floor`); so a crash
//! leaves to check about one housekeeping interval's writes, not all of
//! the run's. A clean unmount moves it the same way, so the next mount
//! checks nothing.
//!
//! One daemon of its namespace only: daemons sharing datanodes write them
//! concurrently, and a stamp at or above the mark would be another
//! daemon's live replica as often as a torn one.

use std::collections::{HashMap, HashSet};

use super::core::Core;
use crate::error::FsResult;
use crate::meta::Counter;
use crate::metrics::Fast;
use crate::storage::{ReplicaState, Storage};
use crate::sync::{Arc, lock};
use pending::{Marks, Unflushed};

pub(super) mod pending;
#[cfg(test)]
mod tests;

/// The datanodes a crash can tear a replica of.
fn tearable(core: &Core) -> Vec<Arc<dyn Storage>> {
    core.dns()
        .attached()
        .into_iter()
        .filter(|d| d.may_tear())
        .collect()
}

/// A datanode and the replicas (block, stamp) it holds at or above its
/// flush mark.
type Listed = (Arc<dyn Storage>, Vec<(u64, u64)>);

/// One sync per filesystem where `syncfs` is a barrier (through the
/// marks' own descriptor, `Storage::sync_for_mark`), else each of
/// `replicas` (block, stamp) of that datanode on its own. Whether all
/// succeeded.
fn sync_all(dns: &[Listed]) -> bool {
    let mut ok = true;
    let mut by_fs: HashMap<u64, &Arc<dyn Storage>> = HashMap::new();
    for (dn, replicas) in dns {
        if dn.syncfs_is_barrier() {
            by_fs.entry(dn.fs_id()).or_insert(dn);
            continue;
        }
        for &(block, gs) in replicas {
            if let Err(e) = dn.sync_replica(block, gs) {
                tracing::error!(block, datanode = %dn.id(), "cannot sync a replica written since the flush mark: {e}");
                ok = false;
            }
        }
    }
    for dn in by_fs.values() {
        if let Err(e) = dn.sync_for_mark() {
            tracing::error!(datanode = %dn.id(), "cannot sync the replicas written since the flush mark: {e}");
            ok = false;
        }
    }
    ok
}

/// The datanodes to sync before the marks move to `stamp`, with the
/// replicas each must sync one by one (none where `syncfs` is a barrier);
/// `None` if one could not be listed.
fn to_sync(core: &Core, stamp: u64) -> Option<Vec<Listed>> {
    let mut listed = Vec::new();
    for dn in tearable(core) {
        if dn.syncfs_is_barrier() {
            listed.push((dn, Vec::new()));
        } else {
            let r = above_mark(&dn, stamp)?;
            listed.push((dn, r));
        }
    }
    Some(listed)
}

/// Every finalized replica of `dn` at or above its flush mark (all of
/// them when it has none, or one above `ceiling`: a metadata store
/// restored from an older copy hands out stamps below it again).
fn above_mark(dn: &Arc<dyn Storage>, ceiling: u64) -> Option<Vec<(u64, u64)>> {
    let mark = match dn.flushed_mark() {
        Ok(Some(m)) if m <= ceiling => m,
        Ok(Some(m)) => {
            tracing::warn!(datanode = %dn.id(), mark = m, "flush mark above every stamp handed out (the metadata store is older than the datanode): every replica is checked");
            0
        }
        Ok(None) => 0,
        Err(e) => {
            tracing::warn!(datanode = %dn.id(), "cannot read the flush mark, every replica is checked: {e}");
            0
        }
    };
    match dn.list() {
        Ok(l) => Some(
            l.into_iter()
                .filter(|r| r.gs >= mark && r.state == ReplicaState::Finalized)
                .map(|r| (r.block, r.gs))
                .collect(),
        ),
        Err(e) => {
            tracing::error!(datanode = %dn.id(), "cannot list the replicas written since the flush mark: {e}");
            None
        }
    }
}

impl Core {
    /// At mount, after the journal's replay and the recovery of files left
    /// open, before anything is served: the replicas written since each
    /// datanode's flush mark are synced and reported for housekeeping to
    /// check. Returns how many were reported.
    pub(super) fn check_unflushed(&self) -> FsResult<usize> {
        let dns = tearable(self);
        if dns.is_empty() {
            return Ok(0);
        }
        // Every stamp below it was handed out before this mount.
        let ceiling = self.meta().alloc(Counter::GenStamp)?;
        let mut synced = true;
        let mut listed = Vec::new();
        for dn in dns {
            match above_mark(&dn, ceiling) {
                Some(r) => listed.push((dn, r)),
                None => synced = false,
            }
        }
        synced &= sync_all(&listed);
        let gs = self.meta().alloc(Counter::GenStamp)?;
        let mut waiting = HashSet::new();
        for (dn, replicas) in &listed {
            for &(block, stamp) in replicas {
                let recorded = self
                    .meta()
                    .block_by_id(block)?
                    .is_some_and(|b| b.finalized && b.gs == stamp && b.replicas.contains(&dn.id()));
                if recorded {
                    self.bad().report(block, dn.id());
                    dn.io().fast(Fast::UnflushedChecked);
                    waiting.insert((block, dn.id()));
                }
            }
        }
        let n = waiting.len();
        if n > 0 {
            tracing::info!(
                replicas = n,
                "replicas written since their datanode's flush mark: housekeeping checks their checksums"
            );
        }
        *lock(&self.unflushed) = if synced {
            Marks::Checking(Unflushed::new(gs, waiting))
        } else {
            tracing::warn!("a sync at mount failed: the flush marks stay where they are");
            Marks::Stuck
        };
        self.advance_flush_marks();
        Ok(n)
    }

    /// After a housekeeping round (and at mount): once every replica the
    /// mount reported was checked (no longer suspect), the flush marks
    /// move up to the mount's stamp; from then on, after every round in
    /// which anything was written.
    pub(crate) fn advance_flush_marks(&self) {
        let mut g = lock(&self.unflushed);
        match &mut *g {
            Marks::Off | Marks::Stuck => {}
            Marks::Checking(u) => {
                if let Some(gs) = u.checked(&self.bad().list())
                    && set_marks(self, gs)
                {
                    *g = Marks::Moving { last: gs };
                }
            }
            Marks::Moving { last } => {
                let Ok(stamp) = self.meta().alloc(Counter::GenStamp) else {
                    return;
                };
                // No stamp handed out and nothing finalized since the last
                // move: nothing was written.
                if stamp == *last + 1 && !self.ctx.floor.dirty() {
                    *last = stamp;
                    return;
                }
                *g = if move_marks(self, stamp) {
                    Marks::Moving { last: stamp }
                } else {
                    Marks::Stuck
                };
            }
        }
    }

    /// At a clean unmount, every close done: the replicas written since
    /// the marks are synced and the marks move above every stamp, so the
    /// next mount checks none. Not while checks a mount asked for are
    /// waiting: their replicas must stay above the mark until they are
    /// checked.
    pub(crate) fn flush_marks_at_unmount(&self) {
        let g = lock(&self.unflushed);
        if !matches!(*g, Marks::Moving { .. }) {
            return;
        }
        if let Ok(stamp) = self.meta().alloc(Counter::GenStamp) {
            move_marks(self, stamp);
        }
    }
}

/// Takes `stamp` (just allocated) as the marks' next value, syncs every
/// datanode a crash can tear and moves the marks up: to `stamp`, or below
/// a replica still being finalized. Whether the syncs succeeded (a failed
/// one leaves the marks where they are, for good: see [`Marks::Stuck`]).
fn move_marks(core: &Core, stamp: u64) -> bool {
    let mark = core.ctx.floor.take(stamp);
    let Some(listed) = to_sync(core, stamp) else {
        tracing::error!("cannot list the replicas to sync: the flush marks stay where they are");
        return false;
    };
    if !sync_all(&listed) {
        tracing::error!("a sync failed: the flush marks stay where they are");
        return false;
    }
    set_marks(core, mark);
    true
}

/// Puts `gs` as the flush mark of every datanode a crash can tear, where
/// it is above the mark there; whether all took it (one that did not
/// checks more at the next mount).
fn set_marks(core: &Core, gs: u64) -> bool {
    let mut all = true;
    for dn in tearable(core) {
        if dn.flushed_mark().ok().flatten().is_some_and(|m| m >= gs) {
            continue;
        }
        if let Err(e) = dn.set_flushed_mark(gs) {
            tracing::warn!(datanode = %dn.id(), "cannot move the flush mark up: {e}");
            all = false;
        }
    }
    all
}
