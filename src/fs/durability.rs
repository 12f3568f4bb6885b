//! `fsync` through any descriptor: what the filesystem owes to a power
//! cut beyond the write path (see also `deletions`).

use super::core::{Core, Reply};
use crate::pipeline::durable;
use crate::sync::Arc;

impl Core {
    /// fsync: acknowledged by all replicas, then data, checksums and
    /// metadata durable on every replica and in the metadata store. Through
    /// any descriptor, as POSIX asks: one that never wrote (read-only, or
    /// opened for writing and idle) makes durable what the file's writer
    /// has written so far and every block earlier writers finished; so
    /// does a write descriptor whose grant ended at a close.
    /// Its latency, request to reply, goes to the statistics.
    pub fn fsync(self: &Arc<Self>, fh: u64, reply: Reply<()>) {
        let (start, metrics) = (std::time::Instant::now(), self.ctx.metrics.clone());
        let reply: Reply<()> = Box::new(move |r| {
            metrics.fsync_done(start.elapsed());
            reply(r)
        });
        let h = match self.handles.get(fh) {
            Ok(h) => h,
            Err(e) => return reply(Err(e)),
        };
        // A write descriptor whose grant a close ended (over etcd, see
        // `closing`) syncs as one that never wrote: what the file's
        // writers wrote is made durable, whoever has the file now.
        if let Some(stream) = h.stream.clone().filter(|_| h.live()) {
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

    /// fsync of a directory: the metadata store's log made durable, on the
    /// blocking pool.
    pub fn fsync_dir(self: &Arc<Self>, reply: Reply<()>) {
        let me = self.clone();
        self.ctx
            .rt
            .spawn_blocking(move || reply(me.meta().sync_if_needed()));
    }
}
