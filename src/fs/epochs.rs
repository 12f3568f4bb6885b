//! Lease epochs: those of a lone daemon, reserved durably from the
//! metadata store ([`StoreEpochs`]), and the epochs of grants not yet
//! recorded with their inodes ([`GrantEpochs`]).

use dashmap::DashMap;

use crate::error::FsResult;
use crate::lease::EpochSource;
use crate::meta::{BlockMap, Change, Counters};
use crate::sync::{Arc, AtomicBool, Mutex, Ordering, lock};

/// How many epochs one durable reservation takes.
const EPOCH_BATCH: u64 = 1024;

/// Epochs reserved from the metadata store in batches, so that a grant
/// needs no commit. Each reservation is durable before any epoch of it is
/// handed out (a power cut must never let an epoch repeat: fencing depends
/// on it), and the next batch is reserved in the background once half of
/// the current one is used, so a grant never waits for the disk unless the
/// store fell behind. A reservation that fails fails the grant.
pub(super) struct StoreEpochs {
    meta: Arc<dyn Counters>,
    rt: tokio::runtime::Handle,
    next: u64,
    end: u64,
    /// The first epoch of a batch reserved ahead (or why that failed).
    spare: Arc<Mutex<Option<FsResult<u64>>>>,
    refilling: Arc<AtomicBool>,
}

impl StoreEpochs {
    pub(super) fn new(meta: Arc<dyn Counters>, rt: tokio::runtime::Handle) -> StoreEpochs {
        let s = StoreEpochs {
            meta,
            rt,
            next: 0,
            end: 0,
            spare: Arc::default(),
            refilling: Arc::default(),
        };
        s.refill();
        s
    }

    /// Reserves the next batch in the background.
    fn refill(&self) {
        if self.refilling.swap(true, Ordering::AcqRel) {
            return;
        }
        let (meta, spare, refilling) = (
            self.meta.clone(),
            self.spare.clone(),
            self.refilling.clone(),
        );
        self.rt.spawn_blocking(move || {
            let r = meta.reserve_epochs(EPOCH_BATCH);
            if let Err(e) = &r {
                tracing::error!("cannot reserve epochs: {e}");
            }
            *lock(&spare) = Some(r);
            refilling.store(false, Ordering::Release);
        });
    }
}

impl EpochSource for StoreEpochs {
    fn next(&mut self, _file: u64) -> Result<u64, String> {
        if self.next >= self.end {
            let first = match lock(&self.spare).take() {
                // (A batch reserved before one taken synchronously lies
                // below it: never used.)
                Some(Ok(first)) if first >= self.end => first,
                // None ready (or it failed): reserve now, or fail the grant.
                _ => self
                    .meta
                    .reserve_epochs(EPOCH_BATCH)
                    .map_err(|e| format!("cannot reserve epochs durably: {e}"))?,
            };
            self.next = first;
            self.end = first + EPOCH_BATCH;
        }
        if self.end - self.next == EPOCH_BATCH / 2 {
            self.refill();
        }
        let e = self.next;
        self.next += 1;
        Ok(e)
    }
}

/// The epochs of grants not yet recorded with their inode (ino -> epoch):
/// a grant costs no commit; the monitor and the unmount write them in
/// batches, and `user.leasefs.epoch` reads them before the store.
#[derive(Default)]
pub struct GrantEpochs {
    unrecorded: DashMap<u64, u64>,
}

impl GrantEpochs {
    pub fn granted(&self, ino: u64, epoch: u64) {
        self.unrecorded.insert(ino, epoch);
    }

    /// The epoch of `ino`'s last grant, if it is not recorded yet.
    pub fn unrecorded(&self, ino: u64) -> Option<u64> {
        self.unrecorded.get(&ino).map(|e| *e)
    }

    /// Records the epochs of recent grants with their inodes.
    pub fn persist(&self, meta: &dyn BlockMap) {
        if self.unrecorded.is_empty() {
            return;
        }
        let batch: Vec<(u64, u64)> = self
            .unrecorded
            .iter()
            .map(|e| (*e.key(), *e.value()))
            .collect();
        // In pieces: etcd caps the operations of one transaction, and
        // epochs only ever rise, so a partly recorded batch is harmless.
        let r = batch.chunks(64).try_for_each(|part| {
            let ch: Vec<Change> = part
                .iter()
                .map(|&(ino, epoch)| Change::SetLastEpoch { ino, epoch })
                .collect();
            meta.commit(&ch, false).map(drop)
        });
        match r {
            Ok(()) => {
                for (ino, e) in batch {
                    self.unrecorded.remove_if(&ino, |_, v| *v == e);
                }
            }
            Err(e) => tracing::warn!("cannot record grant epochs: {e}"),
        }
    }
}
