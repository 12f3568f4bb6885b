//! The worker behind an [`OutputStream`] (HDFS `DataStreamer` and
//! `ResponseProcessor` in one): takes jobs in order, writes each packet to
//! every replica of the current block, acknowledges it when all replicas
//! wrote it, rebuilds the pipeline when a replica fails, and completes
//! flush/sync/close barriers once everything before them is acknowledged.
//!
//! Replicas are written one after the other by this one thread: on one
//! machine the copies go to the page cache, so a chain of threads would add
//! wake-ups without adding safety; `sync` fans out in parallel because each
//! fsync waits on its disk.

use super::durable::{self, Replica, SyncJob};
use super::stream::{Done, Job, OutputStream, Packet, State};
use crate::error::{FsError, FsResult};
use crate::meta::{BlockRow, Change, Counter, DnId, Meta, now_ns};
use crate::pipeline::datanodes::FULL_BELOW;
use crate::storage::datanode::{ReplicaWriter, StorageError};
use crate::storage::replica::ChunkAccumulator;
use crate::sync::{Arc, lock};

/// The open pipeline of the block being written.
pub(crate) struct Pipe {
    block: Option<OpenBlock>,
    crcs: Vec<u32>,
    /// Blocks finalised or cut since the last sync (ids). Closing
    /// promises no durability; `fsync` syncs these too.
    unsynced: Vec<u64>,
    /// The file's under-construction record is in the metadata store.
    uc_recorded: bool,
    /// No block from this index on exists: none did when the stream
    /// started, and only the stream adds blocks, in order. Spares the
    /// block-list query when a new block starts (every small file's only
    /// block). `None` once a truncate or an abort may have changed that.
    new_from: Option<u64>,
}

struct OpenBlock {
    row: BlockRow,
    /// File offset of the block's first byte.
    start: u64,
    writers: Vec<(DnId, ReplicaWriter)>,
    acc: ChunkAccumulator,
    /// Every replica synced since the last byte was written.
    synced: bool,
}

impl Pipe {
    /// The pipeline of a stream starting on a file of `size` bytes.
    pub(crate) fn new(size: u64, block_size: u64) -> Pipe {
        Pipe {
            block: None,
            crcs: Vec::new(),
            unsynced: Vec::new(),
            uc_recorded: false,
            new_from: Some(size.div_ceil(block_size)),
        }
    }
    pub(crate) fn reset(&mut self) {
        self.block = None;
        self.new_from = None;
    }
}

/// Everything waiting on a failed stream, to be failed outside the lock.
pub(crate) fn take_callbacks(s: &mut State) -> Vec<Done> {
    let mut v: Vec<Done> = s.blocked.take().map(|b| b.done).into_iter().collect();
    for j in s.jobs.drain(..) {
        match j {
            Job::Packet(_) => {}
            Job::Flush(d) | Job::Sync(d) | Job::Close(d) | Job::Truncate(_, d) => v.push(d),
        }
    }
    s.in_flight = 0;
    v
}

impl OutputStream {
    /// Drains the job queue; exactly one runs per stream (`running`).
    pub(crate) fn drain(self: Arc<Self>) {
        let mut pipe = lock(&self.pipe);
        loop {
            let job = {
                let mut s = lock(&self.st);
                if let Some(e) = s.failed.clone() {
                    let cbs = take_callbacks(&mut s);
                    s.running = false;
                    self.idle.notify_all();
                    drop(s);
                    for d in cbs {
                        d(Err(e.clone()));
                    }
                    return;
                }
                match s.jobs.pop_front() {
                    Some(j) => j,
                    None => {
                        s.running = false;
                        self.idle.notify_all();
                        return;
                    }
                }
            };
            match job {
                Job::Packet(mut p) => {
                    let end = p.off + p.data.len() as u64;
                    let r = self.contained(|| self.send(&mut pipe, &p));
                    let mut s = lock(&self.st);
                    let mut wake = Vec::new();
                    match r {
                        Ok(()) => {
                            s.acked = s.acked.max(end);
                            s.in_flight -= 1;
                            self.ctx.metrics.packet_acked();
                            // Back to the write buffer first: streams that
                            // queued for it come before this one's next.
                            drop(p.unit.take());
                            if let Some(d) = self.resume_blocked(&mut s) {
                                wake.push(d);
                            }
                        }
                        Err(e) => {
                            tracing::error!(ino = self.ino, "write pipeline failed: {e}");
                            s.failed = Some(e);
                        }
                    }
                    drop(s);
                    for d in wake {
                        d(Ok(()));
                    }
                }
                // On a lone daemon hflush needs no metadata: readers take
                // the visible length from the stream, and recovery takes
                // it from the replicas. Readers on other daemons see only
                // the store, so there the length is published.
                Job::Flush(d) => d(self.contained(|| self.publish_length())),
                Job::Sync(d) => {
                    let r = self.contained(|| {
                        self.publish_length()
                            .and_then(|_| self.sync_durably(&mut pipe))
                    });
                    d(r)
                }
                Job::Close(d) => {
                    let r = self.contained(|| self.finish(&mut pipe));
                    let mut s = lock(&self.st);
                    match &r {
                        // Clean again unless more came in meanwhile: a
                        // later close (RELEASE) has nothing left to do.
                        Ok(()) => {
                            if s.jobs.is_empty() && s.cur.is_empty() && s.blocked.is_none() {
                                s.dirty = false;
                            }
                        }
                        // The file's close is not recorded: the descriptor
                        // is done (later calls get the same error) and its
                        // release closes the file by lease recovery.
                        Err(e) => {
                            tracing::error!(ino = self.ino, "close failed: {e}");
                            s.failed = Some(e.clone());
                        }
                    }
                    drop(s);
                    d(r)
                }
                Job::Truncate(size, d) => {
                    let r = self.contained(|| self.apply_truncate(&mut pipe, size));
                    if let Err(e) = &r {
                        lock(&self.st).failed = Some(e.clone());
                    } else {
                        let mut s = lock(&self.st);
                        s.acked = size;
                    }
                    d(r)
                }
            }
        }
    }

    /// Records the visible length for readers on other daemons (only
    /// when the namespace is shared).
    fn publish_length(&self) -> FsResult<()> {
        if !self.ctx.publish_lengths {
            return Ok(());
        }
        let (size, touch) = {
            let s = lock(&self.st);
            (s.acked, s.mtime)
        };
        let ch = [Change::SetSize {
            ino: self.ino,
            size,
            touch,
        }];
        self.meta().commit(&ch, false).map(drop)
    }

    fn meta(&self) -> &dyn Meta {
        &*self.ctx.meta
    }

    /// Records a block row, with the file's under-construction record the
    /// first time, in one commit (`durable`: synced when this returns).
    fn record_block(&self, pipe_uc: &mut bool, row: &BlockRow, durable: bool) -> FsResult<()> {
        let first = !*pipe_uc;
        let mut ch = Vec::with_capacity(2);
        if first {
            ch.push(Change::PutUc(self.uc.clone()));
        }
        ch.push(Change::PutBlock(row.clone()));
        self.meta().commit(&ch, durable)?;
        *pipe_uc = true;
        Ok(())
    }

    /// A finalised block's row and the file length it implies, in one commit.
    fn record_finalized(&self, row: &BlockRow, size: u64) -> FsResult<()> {
        let ch = [
            Change::PutBlock(row.clone()),
            Change::SetSize {
                ino: self.ino,
                size,
                touch: None,
            },
        ];
        self.meta().commit(&ch, false).map(drop)
    }

    /// Streams one packet through the pipeline, rebuilding it on failure.
    fn send(&self, pipe: &mut Pipe, p: &Packet) -> FsResult<()> {
        crate::fault::panic_if("stream", || {
            p.data.starts_with(crate::fault::TRIGGER.as_bytes())
        });
        let bs = self.block_size;
        let full = pipe.block.as_ref().is_some_and(|b| p.off >= b.start + bs);
        if full {
            let b = pipe.block.take().expect("checked above");
            let (row, size) = self.finalize(b, &mut pipe.unsynced)?;
            self.record_finalized(&row, size)?;
        }
        if pipe.block.is_none() {
            let known_new = pipe.new_from.is_some_and(|n| p.off / bs >= n);
            pipe.block = Some(self.open_block(p.off, known_new, &mut pipe.uc_recorded)?);
        }
        let Pipe { block, crcs, .. } = pipe;
        let b = block.as_mut().expect("opened above");
        let boff = p.off - b.start;
        crcs.clear();
        b.acc.crcs_for(boff, &p.data, crcs);
        // A datanode that failed its heartbeat (directory gone, disk
        // unwritable) leaves the pipeline before the next packet.
        while let Some(k) = b
            .writers
            .iter()
            .position(|(dn, _)| !self.ctx.dns.is_alive(*dn))
        {
            tracing::warn!(
                ino = self.ino,
                datanode = %b.writers[k].0,
                "dead datanode leaves the pipeline"
            );
            self.rebuild_pipeline(b, k, boff)?;
        }
        loop {
            let mut failed = None;
            for (k, (dn, w)) in b.writers.iter_mut().enumerate() {
                self.ctx.dns.fault_delay(*dn);
                if let Err(e) = w.write_packet(boff, &p.data, crcs) {
                    tracing::warn!(ino = self.ino, datanode = %dn, "replica write failed: {e}");
                    // ENOSPC: full (still readable), not dead.
                    self.ctx.dns.mark_failed(*dn, &e);
                    failed = Some(k);
                    break;
                }
            }
            match failed {
                None => break,
                Some(k) => self.rebuild_pipeline(b, k, boff)?,
            }
        }
        b.row.len = boff + p.data.len() as u64;
        b.synced = false;
        Ok(())
    }

    /// Pipeline recovery: drop the failed replica, bump the generation
    /// stamp on the survivors (so the dropped one is recognisably stale),
    /// add a spare holding the acknowledged prefix where one exists, and
    /// cut every replica back to that prefix so the packet can be resent.
    fn rebuild_pipeline(&self, b: &mut OpenBlock, failed: usize, acked: u64) -> FsResult<()> {
        let (bad_dn, _) = b.writers.remove(failed);
        self.ctx.metrics.pipeline_recovery();
        let dns = &self.ctx.dns;
        if b.writers.is_empty() {
            return Err(FsError::Io(format!(
                "every replica of block {} failed",
                b.row.block_id
            )));
        }
        // Recorded first, durably: the new stamp, and the survivors as the
        // block's replicas (the failed one leaves it). The survivors'
        // stamps then follow; one that a crash keeps behind lags the
        // record, which recovery accepts from a member of the block.
        let old_gs = b.row.gs;
        let new_gs = self.meta().alloc(Counter::GenStamp)?;
        b.row.gs = new_gs;
        b.row.replicas = b.writers.iter().map(|(d, _)| *d).collect();
        self.meta()
            .commit(&[Change::PutBlock(b.row.clone())], true)?;
        let old = std::mem::take(&mut b.writers);
        let mut writers = Vec::new();
        for (dn, w) in old {
            drop(w);
            let Some(node) = dns.get(dn) else { continue };
            let r = node
                .bump_gs(b.row.block_id, old_gs, new_gs)
                .and_then(|_| node.reopen_rbw(b.row.block_id, new_gs, acked));
            match r {
                Ok(w) => writers.push((dn, w)),
                Err(e) => {
                    tracing::warn!(
                        datanode = %dn,
                        "dropping replica during pipeline recovery: {e}"
                    );
                    dns.mark_failed(dn, &e);
                }
            }
        }
        let mut used: Vec<DnId> = writers.iter().map(|(d, _)| *d).collect();
        used.push(bad_dn);
        if let Some(&(src_dn, _)) = writers.first()
            && writers.len() < dns.replication
        {
            // Spares with room for the acknowledged prefix and more, tried
            // in turn until the pipeline is whole again (a full datanode is
            // left out, and one that fills during the copy is passed over).
            let room = acked.saturating_add(FULL_BELOW);
            for spare in dns.choose_with_room(dns.len(), &used, room) {
                if writers.len() >= dns.replication {
                    break;
                }
                let (Some(src), Some(dst)) = (dns.get(src_dn), dns.get(spare)) else {
                    continue;
                };
                let r = dst
                    .copy_replica_from(
                        &src,
                        b.row.block_id,
                        new_gs,
                        acked,
                        crate::storage::datanode::ReplicaState::Rbw,
                    )
                    .and_then(|_| dst.reopen_rbw(b.row.block_id, new_gs, acked));
                match r {
                    Ok(w) => writers.push((spare, w)),
                    Err(e) => {
                        tracing::warn!(datanode = %spare, "spare datanode failed: {e}");
                        if matches!(e, StorageError::NoSpace { .. }) {
                            dns.mark_failed(spare, &e);
                        }
                    }
                }
            }
        }
        if writers.is_empty() {
            return Err(FsError::Io(format!(
                "every replica of block {} failed",
                b.row.block_id
            )));
        }
        b.row.replicas = writers.iter().map(|(d, _)| *d).collect();
        b.writers = writers;
        b.synced = false;
        tracing::warn!(
            ino = self.ino,
            block = b.row.block_id,
            gs = new_gs,
            replicas = ?b.row.replicas,
            "pipeline rebuilt"
        );
        // (Spares need no sync of this record: one lost leaves an orphan
        // copy, never a block without its data.)
        self.meta()
            .commit(&[Change::PutBlock(b.row.clone())], false)
            .map(drop)
    }

    /// Opens the block that holds file offset `off`: a new one at a block
    /// boundary, else the file's last block reopened for append under a new
    /// generation stamp.
    fn open_block(&self, off: u64, known_new: bool, uc_recorded: &mut bool) -> FsResult<OpenBlock> {
        let bs = self.block_size;
        let idx = off / bs;
        let start = idx * bs;
        let existing = if known_new {
            None
        } else {
            let blocks = self.meta().blocks(self.ino)?;
            blocks.into_iter().find(|b| b.idx == idx)
        };
        match existing {
            None => {
                let replicas = self.ctx.dns.choose_pipeline()?;
                let block_id = self.meta().alloc(Counter::Block)?;
                let gs = self.meta().alloc(Counter::GenStamp)?;
                let mut writers = Vec::new();
                for dn in replicas {
                    let Some(node) = self.ctx.dns.get(dn) else {
                        continue;
                    };
                    match node.create_rbw(block_id, gs) {
                        Ok(w) => writers.push((dn, w)),
                        Err(e) => {
                            tracing::warn!(datanode = %dn, "cannot create replica: {e}");
                            self.ctx.dns.mark_failed(dn, &e);
                        }
                    }
                }
                if writers.is_empty() {
                    return Err(FsError::Io("no datanode could take a new block".into()));
                }
                let row = BlockRow {
                    ino: self.ino,
                    idx,
                    block_id,
                    gs,
                    len: 0,
                    finalized: false,
                    replicas: writers.iter().map(|(d, _)| *d).collect(),
                };
                self.record_block(uc_recorded, &row, false)?;
                Ok(OpenBlock {
                    row,
                    start,
                    writers,
                    acc: ChunkAccumulator::new(),
                    synced: false,
                })
            }
            Some(row) => {
                let len = off - start;
                // The partial last chunk, from any replica, before anything
                // changes.
                let tail_start = len - len % crate::storage::checksum::CHUNK_SIZE as u64;
                let mut tail = vec![0u8; (len - tail_start) as usize];
                let have_tail = tail.is_empty()
                    || row.replicas.iter().any(|&dn| {
                        self.ctx.dns.get(dn).is_some_and(|node| {
                            node.read(row.block_id, row.gs, tail_start, &mut tail)
                                .is_ok()
                        })
                    });
                if !have_tail {
                    return Err(FsError::Io(format!(
                        "no replica of block {} could be read to append to it",
                        row.block_id
                    )));
                }
                // The new stamp, the block as being written and the file
                // as under construction are recorded, durably, before any
                // replica carries the stamp: a replica's stamp may lag what
                // the metadata records (recovery and repair settle it),
                // never lead it (that would make every replica stale).
                let new_gs = self.meta().alloc(Counter::GenStamp)?;
                let mut rec = row.clone();
                rec.gs = new_gs;
                rec.len = len;
                rec.finalized = false;
                self.record_block(uc_recorded, &rec, true)?;
                let mut writers = Vec::new();
                for &dn in &row.replicas {
                    let Some(node) = self.ctx.dns.get(dn) else {
                        continue;
                    };
                    let r = node
                        .bump_gs(row.block_id, row.gs, new_gs)
                        .and_then(|_| node.reopen_rbw(row.block_id, new_gs, len));
                    match r {
                        Ok(w) => writers.push((dn, w)),
                        Err(e) => {
                            tracing::warn!(datanode = %dn, "replica not reopened for append: {e}")
                        }
                    }
                }
                if writers.is_empty() {
                    return Err(FsError::Io(format!(
                        "no replica of block {} could be reopened for append",
                        row.block_id
                    )));
                }
                if writers.len() < rec.replicas.len() {
                    rec.replicas = writers.iter().map(|(d, _)| *d).collect();
                    self.record_block(uc_recorded, &rec, false)?;
                }
                Ok(OpenBlock {
                    row: rec,
                    start,
                    writers,
                    acc: ChunkAccumulator::resume(tail),
                    synced: false,
                })
            }
        }
    }

    /// Closes the replicas of a block and moves them to `finalized/`;
    /// returns its row and the file length it ends at, for the caller to
    /// record (with whatever else it commits).
    fn finalize(&self, mut b: OpenBlock, unsynced: &mut Vec<u64>) -> FsResult<(BlockRow, u64)> {
        let len = b.row.len;
        let mut ok = Vec::new();
        for (dn, w) in b.writers.drain(..) {
            let Some(node) = self.ctx.dns.get(dn) else {
                continue;
            };
            match node.finalize_written(w, b.row.block_id, b.row.gs, len) {
                Ok(()) => ok.push(dn),
                Err(e) => tracing::warn!(datanode = %dn, "finalize failed: {e}"),
            }
        }
        if ok.is_empty() {
            return Err(FsError::Io(format!(
                "no replica of block {} finalized",
                b.row.block_id
            )));
        }
        b.row.finalized = true;
        if !b.synced {
            unsynced.push(b.row.block_id);
        }
        b.row.replicas = ok;
        Ok((b.row, b.start + len))
    }

    fn mtime_now(&self) -> i64 {
        lock(&self.st).mtime.unwrap_or_else(now_ns)
    }

    /// fsync: the replicas being written (through their writers), every
    /// other block of the file not known durable (those this stream
    /// finished since its last sync; all of them the first time, unless a
    /// sync since the daemon started covered them), and the metadata
    /// store, all in parallel (see `durable`). The store needs no new
    /// commit unless a replica failed: what it must keep (the file, its
    /// blocks and replicas, its under-construction record) was committed
    /// when it changed, and the length of a file under construction is
    /// settled from its replicas by recovery.
    fn sync_durably(&self, pipe: &mut Pipe) -> FsResult<()> {
        let ids = std::mem::take(&mut pipe.unsynced);
        let r = self.sync_with(pipe, &ids);
        if r.is_err() {
            pipe.unsynced.extend(ids);
        }
        r
    }

    fn sync_with(&self, pipe: &mut Pipe, ids: &[u64]) -> FsResult<()> {
        let ctx = &self.ctx;
        let whole = !lock(&ctx.synced_files).contains(&self.ino);
        let open_id = pipe.block.as_ref().map(|b| b.row.block_id);
        let mut rows: Vec<BlockRow> = if whole || !ids.is_empty() {
            self.meta()
                .blocks(self.ino)?
                .into_iter()
                .filter(|r| Some(r.block_id) != open_id && (whole || ids.contains(&r.block_id)))
                .collect()
        } else {
            Vec::new()
        };
        let mut replicas: Vec<Replica> = Vec::new();
        if let Some(b) = &pipe.block {
            replicas.extend(b.writers.iter().map(|(dn, _)| (b.row.block_id, *dn)));
        }
        for r in &rows {
            replicas.extend(r.replicas.iter().map(|dn| (r.block_id, *dn)));
        }
        let results =
            durable::sync_replicas(ctx, replicas, |who| self.file_syncs(pipe, &rows, who))?;
        let mut changed = durable::drop_failed(ctx, self.ino, &mut rows, &results)?;
        if let Some(b) = pipe.block.as_mut() {
            let mut open = [b.row.clone()];
            let left = durable::drop_failed(ctx, self.ino, &mut open, &results)?;
            if let Some(row) = left.into_iter().next() {
                b.writers.retain(|(dn, _)| row.replicas.contains(dn));
                b.row.replicas = row.replicas.clone();
                changed.push(row);
            }
            b.synced = true;
        }
        if !changed.is_empty() {
            let ch: Vec<Change> = changed.into_iter().map(Change::PutBlock).collect();
            self.meta().commit(&ch, true)?;
        }
        if whole {
            lock(&ctx.synced_files).insert(self.ino);
        }
        Ok(())
    }

    /// The per-file syncs that make one replica durable: through its
    /// writer (data, checksums, and the directory the first time), or, for
    /// a closed block, of the replica at its recorded generation stamp.
    fn file_syncs(&self, pipe: &Pipe, rows: &[BlockRow], who: Replica) -> FsResult<Vec<SyncJob>> {
        let (block, dn) = who;
        if let Some(b) = pipe.block.as_ref().filter(|b| b.row.block_id == block) {
            let Some((_, w)) = b.writers.iter().find(|(d, _)| *d == dn) else {
                return Ok(Vec::new());
            };
            return Ok(w
                .sync_tasks()?
                .into_iter()
                .map(|t| durable::job(who, Box::new(move || t().map_err(FsError::from))))
                .collect());
        }
        Ok(rows
            .iter()
            .find(|r| r.block_id == block)
            .map(|r| durable::closed_replica_syncs(&self.ctx, who, r.gs))
            .unwrap_or_default())
    }

    /// Close: finalise the last block, record the length, and end the
    /// file's time under construction. The stream stays usable: a later
    /// write reopens the last block for append, as on a closed file.
    fn finish(&self, pipe: &mut Pipe) -> FsResult<()> {
        let last = match pipe.block.take() {
            Some(b) => Some(self.finalize(b, &mut pipe.unsynced)?.0),
            None => None,
        };
        if !pipe.unsynced.is_empty() {
            // What this stream leaves unsynced: a later fsync looks again.
            lock(&self.ctx.synced_files).remove(&self.ino);
        }
        // Under the stream's lock: see `OutputStream::set_mtime`.
        let s = lock(&self.st);
        let (acked, mtime) = (s.acked, s.mtime);
        let mut ch: Vec<Change> = last.into_iter().map(Change::PutBlock).collect();
        ch.push(Change::SetSize {
            ino: self.ino,
            size: acked,
            touch: mtime,
        });
        ch.push(Change::DelUc(self.ino));
        let r = self.meta().commit(&ch, false).map(drop);
        drop(s);
        if r.is_ok() {
            // As a stream that starts on a closed file of this length.
            pipe.uc_recorded = false;
            pipe.new_from = Some(acked.div_ceil(self.block_size));
        }
        r
    }

    /// Truncate to `size`: drops whole blocks past it, cuts the block that
    /// holds it to the new length under a new generation stamp, or grows
    /// the file by streaming zeros.
    fn apply_truncate(&self, pipe: &mut Pipe, size: u64) -> FsResult<()> {
        pipe.new_from = None;
        if !pipe.uc_recorded {
            self.meta()
                .commit(&[Change::PutUc(self.uc.clone())], false)?;
            pipe.uc_recorded = true;
        }
        let cur = match pipe.block.take() {
            Some(b) => {
                let (row, end) = self.finalize(b, &mut pipe.unsynced)?;
                self.record_finalized(&row, end)?;
                Some(end)
            }
            None => None,
        };
        let old = match cur {
            Some(c) => c,
            None => self.meta().get(self.ino)?.size,
        };
        if size >= old {
            let mut off = old;
            let zeros = vec![0u8; self.ctx.packet_size];
            while off < size {
                let room = (self.block_size - off % self.block_size).min(zeros.len() as u64);
                let n = room.min(size - off) as usize;
                self.send(
                    pipe,
                    &Packet {
                        off,
                        data: zeros[..n].to_vec(),
                        unit: None,
                    },
                )?;
                off += n as u64;
            }
            let mtime = self.mtime_now();
            return self.persist_length_at(pipe, size, mtime);
        }
        let bs = self.block_size;
        let keep = size.div_ceil(bs);
        let mtime = self.mtime_now();
        let mut ch = vec![
            Change::DropBlocksFrom {
                ino: self.ino,
                from: keep,
            },
            Change::SetSize {
                ino: self.ino,
                size,
                touch: Some(mtime),
            },
        ];
        // The block that holds the new end is cut under a new stamp.
        let mut cut = None;
        if !size.is_multiple_of(bs) {
            let idx = size / bs;
            if let Some(row) = self
                .meta()
                .blocks(self.ino)?
                .into_iter()
                .find(|b| b.idx == idx)
            {
                let mut rec = row.clone();
                rec.gs = self.meta().alloc(Counter::GenStamp)?;
                rec.len = size - idx * bs;
                ch.push(Change::PutBlock(rec.clone()));
                cut = Some((row, rec));
            }
        }
        // Recorded first, durably; only then are the replicas of the
        // dropped blocks deleted and those of the cut block cut (a replica
        // may lag the record, never lead it, and none that a durable record
        // names is ever deleted).
        let gone = self.meta().commit(&ch, true)?;
        self.ctx.dns.delete_blocks(&gone);
        if let Some((row, mut rec)) = cut {
            let mut ok = Vec::new();
            for &dn in &row.replicas {
                let Some(node) = self.ctx.dns.get(dn) else {
                    continue;
                };
                match node.truncate(row.block_id, row.gs, rec.gs, rec.len) {
                    Ok(()) => ok.push(dn),
                    Err(e) => tracing::warn!(datanode = %dn, "replica truncate failed: {e}"),
                }
            }
            if ok.is_empty() {
                return Err(FsError::Io("no replica could be truncated".into()));
            }
            pipe.unsynced.push(rec.block_id);
            if ok.len() < rec.replicas.len() {
                rec.replicas = ok;
                self.meta().commit(&[Change::PutBlock(rec)], false)?;
            }
        }
        Ok(())
    }

    fn persist_length_at(&self, pipe: &Pipe, size: u64, mtime: i64) -> FsResult<()> {
        let mut ch: Vec<Change> = pipe
            .block
            .iter()
            .map(|b| Change::PutBlock(b.row.clone()))
            .collect();
        ch.push(Change::SetSize {
            ino: self.ino,
            size,
            touch: Some(mtime),
        });
        self.meta().commit(&ch, false).map(drop)
    }
}
