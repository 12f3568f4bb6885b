//! Deleting replicas only once the metadata that stopped naming them is
//! durable ([`Deletions`]).

use crate::meta::{BlockRow, Meta};
use crate::pipeline::Datanodes;
use crate::sync::{Arc, Mutex, lock};

/// Replicas waiting to be deleted. A power cut must never bring back a
/// block whose replicas are gone, so they are deleted only once the
/// metadata that stopped naming them is durable. Deletions queue for one
/// worker, which makes the metadata durable once per batch (an `rm -rf`
/// costs a few syncs, not one per file).
pub struct Deletions {
    meta: Arc<dyn Meta>,
    dns: Arc<Datanodes>,
    rt: tokio::runtime::Handle,
    /// Blocks whose replicas wait, and whether the worker runs.
    queue: Arc<Mutex<(Vec<BlockRow>, bool)>>,
}

impl Deletions {
    pub fn new(meta: Arc<dyn Meta>, dns: Arc<Datanodes>, rt: tokio::runtime::Handle) -> Self {
        Deletions {
            meta,
            dns,
            rt,
            queue: Arc::default(),
        }
    }

    /// Deletes the replicas of `blocks`, which the metadata no longer
    /// names, once that is durable.
    pub fn delete(&self, blocks: Vec<BlockRow>) {
        if blocks.is_empty() {
            return;
        }
        let start = {
            let mut q = lock(&self.queue);
            q.0.extend(blocks);
            !std::mem::replace(&mut q.1, true)
        };
        if !start {
            return;
        }
        let (dns, meta, queue) = (self.dns.clone(), self.meta.clone(), self.queue.clone());
        self.rt.spawn_blocking(move || {
            loop {
                let batch = {
                    let mut q = lock(&queue);
                    if q.0.is_empty() {
                        q.1 = false;
                        return;
                    }
                    std::mem::take(&mut q.0)
                };
                match meta.sync_if_needed() {
                    Ok(()) => dns.delete_blocks(&batch),
                    // Kept: the orphan sweep removes them once the
                    // metadata is durable.
                    Err(e) => tracing::error!(
                        "replicas of {} removed blocks kept: cannot make the metadata durable: {e}",
                        batch.len()
                    ),
                }
            }
        });
    }
}
