//! What [`Core`] owes to a power cut beyond the write path: `fsync`
//! through any descriptor, and deleting replicas only once the metadata
//! that stopped naming them is durable.

use super::core::{Core, Reply};
use crate::pipeline::durable;
use crate::sync::{Arc, lock};

impl Core {
    /// fsync: acknowledged by all replicas, then data, checksums and
    /// metadata durable on every replica and in the metadata store. Through
    /// any descriptor, as POSIX asks: one that never wrote (read-only, or
    /// opened for writing and idle) makes durable what the file's writer
    /// has written so far and every block earlier writers finished.
    /// Its latency, request to reply, goes to the statistics.
    pub fn fsync(self: &Arc<Self>, fh: u64, reply: Reply<()>) {
        let (start, metrics) = (std::time::Instant::now(), self.ctx.metrics.clone());
        let reply: Reply<()> = Box::new(move |r| {
            metrics.fsync_done(start.elapsed());
            reply(r)
        });
        let h = match self.handle(fh) {
            Ok(h) => h,
            Err(e) => return reply(Err(e)),
        };
        if let Some(stream) = h.stream.clone() {
            if let Err(e) = self.writable(&h) {
                return reply(Err(e));
            }
            return stream.sync(reply);
        }
        let (ctx, ino) = (self.ctx.clone(), h.ino);
        match self.stream_of(ino) {
            // Another descriptor writes it: through its stream, after what
            // it queued. A stream that failed meanwhile (its writer fenced)
            // leaves what its replicas hold, synced as any closed file's.
            Some(stream) => stream.sync(Box::new(move |r| match r {
                Ok(()) => reply(Ok(())),
                Err(_) => reply(durable::sync_file(&ctx, ino)),
            })),
            None => {
                self.ctx
                    .rt
                    .spawn_blocking(move || reply(durable::sync_file(&ctx, ino)));
            }
        }
    }

    /// Deletes the replicas of blocks the metadata no longer names, once
    /// that is durable: a power cut must never bring back a block whose
    /// replicas are gone. Deletions queue for one worker, which makes the
    /// metadata durable once per batch (an `rm -rf` costs a few syncs, not
    /// one per file).
    pub(crate) fn delete_replicas(&self, blocks: Vec<crate::meta::BlockRow>) {
        if blocks.is_empty() {
            return;
        }
        let start = {
            let mut q = lock(&self.doomed);
            q.0.extend(blocks);
            !std::mem::replace(&mut q.1, true)
        };
        if !start {
            return;
        }
        let (dns, meta, doomed) = (self.dns.clone(), self.meta.clone(), self.doomed.clone());
        self.ctx.rt.spawn_blocking(move || {
            loop {
                let batch = {
                    let mut q = lock(&doomed);
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
