//! Maintenance views of [`Core`]: recovery at mount, and fsck against the
//! running daemon.

use std::time::Duration;

use super::core::Core;
use crate::error::{FsError, FsResult};
use crate::lease::RecoveryReason;

impl Core {
    /// At mount: files left under construction by a previous daemon have
    /// provably gone holders, so they are recovered now; orphans removed.
    pub fn startup_recovery(&self) -> FsResult<usize> {
        if let Some(cl) = &self.cluster {
            // Other daemons may be writing to the shared datanodes right
            // now: their unrecorded replicas, tmp/ copies and open
            // unlinked files are theirs. The housekeeping leader's sweeps
            // (with their grace period) deal with true leftovers.
            return self.startup_recovery_clustered(cl);
        }
        // Before anything reads, repairs or recovers a replica: those the
        // block journal holds the bytes of are made whole first.
        let replayed = crate::pipeline::journal::replay(&**self.meta(), self.dns())?;
        if replayed.rows > 0 {
            tracing::info!(
                rows = replayed.rows,
                rewritten = replayed.rewritten,
                kept = replayed.kept.len(),
                "block journal replayed"
            );
        }
        self.ctx.journal.keep(&replayed.kept);
        let ucs = self.meta().list_uc()?;
        let n = ucs.len();
        for uc in ucs {
            tracing::info!(ino = uc.ino, holder = %uc.holder, "recovering file left open by a previous daemon");
            if let Err(e) = self.recover(uc.ino, RecoveryReason::HolderGone) {
                tracing::error!(ino = uc.ino, "startup recovery failed: {e}");
            }
        }
        for ino in self.meta().orphans()? {
            self.delete_inode(ino);
        }
        // Copies (re-replication, pipeline spares) a crash interrupted:
        // never recorded anywhere.
        for dn in self.dns().attached() {
            if let Err(e) = dn.clean_tmp() {
                tracing::warn!(datanode = %dn.id(), "cannot clean tmp/: {e}");
            }
        }
        // Replica files of blocks no file has (a crash between creating a
        // replica and committing its block, or a delete that did not get to
        // them), on datanodes recognised by their identity files. Nothing
        // writes yet, so no grace is needed; copies of recorded blocks are
        // never touched here (housekeeping decides on those).
        let swept = crate::fsck::run(&crate::fsck::Check {
            meta: &**self.meta(),
            dns: self.dns(),
            repair: true,
            live_leases: Default::default(),
            busy_blocks: Default::default(),
            progress: false,
            deep: false,
            suspect: Default::default(),
            orphans: true,
            excess: false,
            orphan_grace: Duration::ZERO,
            grace_finalized: false,
            shared: false,
            copy: false,
            pin: &|ino| self.pin(ino),
            recover: &|ino| self.recover(ino, RecoveryReason::HolderGone),
            cancelled: &crate::fsck::never_cancelled,
        })
        .map_err(FsError::Io)?;
        for p in swept.problems.iter().filter(|p| p.repaired) {
            tracing::info!(kind = ?p.kind, path = %p.path, "repaired at mount: {}", p.detail);
        }
        // What a crash may have torn of files closed without an fsync.
        self.check_unflushed()?;
        Ok(n)
    }

    /// Block ids of files being written (never repaired under a writer).
    /// Files being written: those this daemon leases, and over a shared
    /// namespace those any daemon has claimed (`None` if that cannot be
    /// known now: then nothing may be repaired).
    pub fn live_files(&self) -> Option<std::collections::HashSet<u64>> {
        let mut live = std::collections::HashSet::new();
        if let Some(cl) = &self.cluster {
            match cl.claimed_files() {
                // This daemon's own repair pins are claims too, and no
                // writer: a decommission's progress counted the file it was
                // copying as written, so its count stood still until the end.
                Ok(f) => live.extend(f.into_iter().filter(|ino| !self.leases.is_pinned(*ino))),
                Err(e) => {
                    tracing::warn!("cannot list the files other daemons write: {e}");
                    return None;
                }
            }
        }
        // Listed after the claims: a writer that took a file as a pin ended
        // in between is counted here.
        live.extend(self.leases.list().into_iter().map(|l| l.file));
        Some(live)
    }

    pub fn busy_blocks(
        &self,
        live: &std::collections::HashSet<u64>,
    ) -> std::collections::HashSet<u64> {
        live.iter()
            .filter_map(|ino| self.meta().blocks(*ino).ok())
            .flatten()
            .map(|b| b.block_id)
            .collect()
    }

    /// An online fsck against the running daemon's view. `deep` reads
    /// every replica's checksums (R times the data); without it replicas
    /// are checked by presence, generation stamp and length, and only
    /// those reads reported corrupt are verified. The run stops, with an
    /// error, at the first block after `cancelled` says so.
    pub fn fsck(
        &self,
        repair: bool,
        deep: bool,
        cancelled: &dyn Fn() -> bool,
    ) -> Result<crate::fsck::Report, String> {
        let live = self
            .live_files()
            .ok_or("cannot tell which files other daemons are writing")?;
        let busy = self.busy_blocks(&live);
        crate::fsck::run(&crate::fsck::Check {
            meta: &**self.meta(),
            dns: self.dns(),
            repair,
            live_leases: live,
            busy_blocks: busy,
            progress: false,
            deep,
            suspect: if deep {
                Default::default()
            } else {
                self.bad().list().into_iter().collect()
            },
            orphans: true,
            excess: true,
            orphan_grace: crate::fsck::ORPHAN_GRACE,
            grace_finalized: false,
            // Other daemons' blocks in flight are not in this daemon's
            // registry: young replicas are theirs to record.
            shared: self.cluster.is_some(),
            copy: repair,
            pin: &|ino| self.pin(ino),
            recover: &|ino| self.recover(ino, RecoveryReason::HolderGone),
            cancelled,
        })
    }

    /// Keeps writers off `ino` while a repair changes it (see
    /// `fsck::Check::pin`): over etcd with the file's cluster claim (taken
    /// for this daemon, so no other daemon's writer gets it meanwhile),
    /// here with the lease manager's pin. `None` when a writer holds it,
    /// on any daemon, or that cannot be known now.
    pub fn pin(&self, ino: u64) -> Option<crate::fsck::Pinned<'_>> {
        // A handle number no open can have.
        let pseudo = u64::MAX - ino;
        let cl = match &self.cluster {
            Some(cl) => match cl.claim(ino, pseudo, &self.recovery_claimant()) {
                Ok(crate::lease::cluster::Claim::Mine { .. }) => Some(cl),
                Ok(crate::lease::cluster::Claim::Busy(_)) => return None,
                Err(e) => {
                    tracing::warn!(ino, "cannot claim the file for a repair: {e}");
                    return None;
                }
            },
            None => None,
        };
        if !self.leases.pin(ino) {
            if let Some(cl) = cl {
                cl.unclaim(ino, pseudo);
            }
            return None;
        }
        Some(crate::fsck::Pinned::new(move || {
            self.leases.unpin(ino);
            if let Some(cl) = cl {
                cl.unclaim(ino, pseudo);
            }
        }))
    }
}
