//! A cluster of one daemon, for core tests that need a shared namespace's
//! code paths without etcd: every claim is granted at once, and a test can
//! take a claim away behind the daemon's back (as `etcdctl lease revoke`
//! or a keep-alive that found the etcd lease gone would) to drive the
//! paths where the daemon has not yet learnt it lost the claim.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use crate::lease::cluster::{Claim, ClaimInfo, Cluster, EPOCH_SEQ_BITS, Ticket, Turn, Unrenewed};
use crate::lease::{EpochSource, FileId, HandleId};

#[derive(Default)]
pub(crate) struct FakeCluster {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Files this daemon holds the claim of, with the claim's epoch base,
    /// and the handles that share it.
    held: HashMap<FileId, (u64, HashSet<HandleId>)>,
    /// The last claim base handed out: each claim's is above every earlier one.
    base: u64,
    tickets: Ticket,
}

impl FakeCluster {
    /// The claim of `file` is gone in the (imagined) store; the daemon is
    /// not told.
    pub fn drop_claim(&self, file: FileId) {
        self.lock().held.remove(&file);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Cluster for FakeCluster {
    fn claim(&self, file: FileId, handle: HandleId, _who: &ClaimInfo) -> Result<Claim, String> {
        let mut g = self.lock();
        let next = g.base + 1;
        let (base, handles) = g.held.entry(file).or_insert((next, HashSet::new()));
        handles.insert(handle);
        let base = *base;
        g.base = g.base.max(base);
        Ok(Claim::Mine {
            epoch_base: base << EPOCH_SEQ_BITS,
        })
    }

    fn claim_in_turn(
        &self,
        file: FileId,
        handle: HandleId,
        who: &ClaimInfo,
        _pass: Option<Ticket>,
    ) -> Result<Turn, String> {
        self.claim(file, handle, who).map(Turn::Claim)
    }

    fn enqueue(&self, _file: FileId, _handle: HandleId) -> Result<Ticket, String> {
        let mut g = self.lock();
        g.tickets += 1;
        Ok(g.tickets)
    }

    fn dequeue(&self, _file: FileId, _handle: HandleId) {}

    fn unclaim(&self, file: FileId, handle: HandleId) {
        let mut g = self.lock();
        if let Some((_, handles)) = g.held.get_mut(&file) {
            handles.remove(&handle);
            if handles.is_empty() {
                g.held.remove(&file);
            }
        }
    }

    fn lost(&self, file: FileId, epoch: u64) -> bool {
        let mut g = self.lock();
        let mine = g
            .held
            .get(&file)
            .is_some_and(|(base, _)| *base == epoch >> EPOCH_SEQ_BITS);
        if mine {
            g.held.remove(&file);
        }
        mine
    }

    fn renew(&self, file: FileId, _epoch: u64) -> Result<std::time::Duration, Unrenewed> {
        if self.lock().held.contains_key(&file) {
            Ok(std::time::Duration::from_secs(60))
        } else {
            Err(Unrenewed::Lost)
        }
    }

    fn held(&self, file: FileId) -> Option<u64> {
        self.lock()
            .held
            .get(&file)
            .map(|(base, _)| base << EPOCH_SEQ_BITS)
    }

    fn end_remote(&self, _file: FileId, _claim: &ClaimInfo) {}

    fn remote_holder(&self, _file: FileId) -> Option<ClaimInfo> {
        None
    }

    fn claims(&self) -> Result<Vec<(FileId, ClaimInfo)>, String> {
        Ok(Vec::new())
    }

    fn claimed_files(&self) -> Result<Vec<FileId>, String> {
        Ok(self.lock().held.keys().copied().collect())
    }

    fn mount_alive(&self, _mount_id: &str) -> bool {
        true
    }
}

/// Epochs under a claim: the claim's base, then one more per grant.
#[derive(Default)]
pub(crate) struct FakeEpochs {
    last: HashMap<FileId, u64>,
}

impl EpochSource for FakeEpochs {
    fn next(&mut self, file: FileId) -> Result<u64, String> {
        let e = self.last.entry(file).or_insert(1 << EPOCH_SEQ_BITS);
        *e += 1;
        Ok(*e)
    }
}
