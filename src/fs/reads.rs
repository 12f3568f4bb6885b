//! Reads: the bytes the daemon holds in memory first, then the replicas
//! on the blocking pool, each verified against its checksums.

use super::core::{Core, Reply};
use super::handles::Handle;
use crate::error::{FsError, FsResult};
use crate::pipeline::reader::{self, OpenReplicas};
use crate::sync::Arc;

impl Core {
    /// Reads through `fh`. Through the writer's own descriptor a read first
    /// flushes what it wrote (read-your-writes, as on a local filesystem);
    /// every other reader sees the visible length.
    ///
    /// The replicas are read on the blocking pool, never on a request
    /// thread: a slow or failing datanode disk then stalls only its readers;
    /// with `in_memory`, bytes in memory are read first on this thread
    /// ([`Core::read_in_memory`]; false when the caller tried already).
    pub fn read_any(
        self: &Arc<Self>,
        fh: u64,
        offset: u64,
        size: u32,
        in_memory: bool,
        reply: Reply<Vec<u8>>,
    ) {
        let h = match self.handles.get(fh) {
            Ok(h) => h,
            Err(e) => return reply(Err(e)),
        };
        let me = self.clone();
        match h.stream.clone() {
            Some(s) if s.pos() > s.visible_len() && offset + size as u64 > s.visible_len() => {
                // The flush completes on the stream's worker, off the loop.
                s.flush(Box::new(move |r| {
                    reply(r.and_then(|_| me.read(fh, offset, size)))
                }));
            }
            _ => {
                if in_memory {
                    let mut d = reader::spare_buffer(size as usize);
                    if let Some(n) = self.read_in_memory_of(&h, offset, &mut d) {
                        d.truncate(n);
                        return reply(Ok(d));
                    }
                    reader::recycle(d);
                }
                self.ctx
                    .rt
                    .spawn_blocking(move || reply(me.read(fh, offset, size)));
            }
        }
    }

    /// A read served on the request thread, into `out` (as many bytes as
    /// the request asks): only of a file nobody writes, with a local
    /// metadata store (whose reads every lookup makes on a request thread
    /// too), through replica readers the handle keeps, and only if every
    /// byte and checksum it needs is in memory (`reader::read_cached`).
    /// How many bytes it read, or `None`: the request then goes to
    /// [`Core::read_any`], which reads it on the blocking pool. A hand-off
    /// to the pool and back cost a served 1 MiB read more than its copies
    /// (benches/PROFILE.md, "Reads, issue 28").
    pub fn read_in_memory(&self, fh: u64, offset: u64, out: &mut [u8]) -> Option<usize> {
        let h = self.handles.get(fh).ok()?;
        self.read_in_memory_of(&h, offset, out)
    }

    fn read_in_memory_of(&self, h: &Handle, offset: u64, out: &mut [u8]) -> Option<usize> {
        if self.cluster.is_some()
            || h.stream.is_some()
            || h.replicas.is_empty()
            || self.stream_of(h.ino).is_some()
        {
            return None;
        }
        let inode = self.meta().get(h.ino).ok()?;
        let blocks = self.meta().blocks(h.ino).ok()?;
        let bs = if inode.block_size == 0 {
            self.opts.block_size
        } else {
            inode.block_size
        };
        let n = reader::read_cached(&h.replicas, &blocks, bs, inode.size, offset, out)?;
        self.ctx.metrics.read(n as u64);
        Some(n)
    }

    pub fn read(&self, fh: u64, offset: u64, size: u32) -> FsResult<Vec<u8>> {
        let h = self.handles.get(fh)?;
        // A writer may reopen the last block for append (new generation
        // stamp) between our reading the block list and the replicas.
        let mut tries = 0;
        loop {
            match self.read_once(h.ino, offset, size, Some(&h.replicas)) {
                Err(FsError::Moved(why)) if tries < 20 => {
                    tries += 1;
                    tracing::debug!(ino = h.ino, "read again: {why}");
                    std::thread::sleep(std::time::Duration::from_micros(200 * tries));
                }
                r => {
                    if let Ok(d) = &r {
                        self.ctx.metrics.read(d.len() as u64);
                    }
                    return r;
                }
            }
        }
    }

    /// One read of `ino`; `open`: the handle's kept replica readers.
    pub(super) fn read_once(
        &self,
        ino: u64,
        offset: u64,
        size: u32,
        open: Option<&OpenReplicas>,
    ) -> FsResult<Vec<u8>> {
        // The stream before the store, as in `getattr`.
        let stream = self.stream_of(ino);
        let inode = self.meta().get(ino)?;
        let len = match stream {
            Some(s) => s.visible_len(),
            None => inode.size,
        };
        tracing::trace!(ino, offset, size, len, "read");
        if offset >= len {
            return Ok(Vec::new());
        }
        let blocks = self.meta().blocks(ino)?;
        let bs = if inode.block_size == 0 {
            self.opts.block_size
        } else {
            inode.block_size
        };
        let mut skipped = Vec::new();
        let r = reader::read(
            self.dns(),
            self.bad(),
            open,
            &blocks,
            bs,
            len,
            offset,
            size as usize,
            &mut skipped,
        );
        if r.is_ok() && !skipped.is_empty() {
            // Passed-over replicas the block list still names as they were
            // read are really missing or stale; the others had moved on.
            let now = self.meta().blocks(ino)?;
            for sk in skipped {
                let current = now.iter().any(|b| {
                    b.block_id == sk.block && b.gs == sk.gs && b.replicas.contains(&sk.dn)
                });
                if current {
                    reader::report_replica(self.bad(), sk.block, sk.dn, &sk.why);
                }
            }
        }
        r
    }
}
