//! Lease epochs of a lone daemon, reserved durably from the metadata store.

use crate::error::FsResult;
use crate::lease::EpochSource;
use crate::meta::Counters;
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
