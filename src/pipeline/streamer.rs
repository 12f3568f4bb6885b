//! [`DataStreamer`]: the I/O behind an output stream (HDFS's
//! `DataStreamer` and `ResponseProcessor` in one). The stream's worker
//! hands it one job at a time, in order: it writes each packet to every
//! replica of the current block (opening and finalising blocks at their
//! boundaries), makes the file durable for `fsync`, finalises the last
//! block at `close`, and truncates. What it does to the file is reported
//! to the stream's [`super::outcome::FileLog`]; it never records anything
//! itself.

use std::collections::HashMap;

use super::block;
use super::ctx::StreamFile;
use super::durable::{self, Replica, SyncJob, Synced};
use super::in_flight::Hold;
use super::outcome::FileOutcome;
use super::pipe::OpenBlock;
use super::state::Packet;
use crate::error::{FsError, FsResult};
use crate::meta::{BlockRow, Counter};
use crate::storage::{SyncPlan, SyncTask};
use crate::sync::{Mutex, lock};

/// A stream syncs often when it writes at most this much per fsync on
/// average (and synced more than once): it then keeps its replicas
/// zero-filled ahead of it (see [`DataStreamer::after_sync`]).
const SYNC_OFTEN_BELOW: u64 = 256 << 10;
/// How far ahead of the data replicas are zero-filled, in steps of
/// `ZERO_STEP`, once less than `ZERO_LOW` is left.
const ZERO_AHEAD: u64 = 1 << 20;
const ZERO_STEP: u64 = 64 << 10;
const ZERO_LOW: u64 = 256 << 10;

/// A small file's last block written whole by its close, to be recorded
/// ([`DataStreamer::record_closed_whole`]); no sweep deletes its replicas
/// while this lives.
pub(crate) struct Whole {
    row: BlockRow,
    _hold: Hold,
    journaled: bool,
}

/// The streamer's state: the open block, and what the stream knows of the
/// file's blocks.
pub(crate) struct DataStreamer {
    file: StreamFile,
    block: Option<OpenBlock>,
    /// Reused buffer for each packet's checksums.
    crcs: Vec<u32>,
    /// Blocks finalised or cut since the last sync (ids). Closing
    /// promises no durability; `fsync` syncs these too.
    unsynced: Vec<u64>,
    /// No block from this index on exists: none did when the stream
    /// started, and only the stream adds blocks, in order. Spares the
    /// block-list query when a new block starts (every small file's only
    /// block). `None` once a truncate or an abort may have changed that.
    new_from: Option<u64>,
    /// Bytes sent and fsyncs done through this streamer, to tell a stream
    /// that syncs often.
    sent: u64,
    syncs: u64,
    /// An fsync of this stream went through: every block it did not write
    /// itself since (`unsynced` has those) is durable.
    synced_once: bool,
    /// See [`Self::syncs_whole`].
    syncs_whole: bool,
}

/// The block holding the new end of a file being shrunk: its row as it
/// was, and as it is to be (cut, under a new stamp).
struct Cut {
    old: BlockRow,
    new: BlockRow,
}

impl DataStreamer {
    /// The streamer of a stream starting on `file`, `size` bytes long.
    pub fn new(file: StreamFile, size: u64) -> DataStreamer {
        let new_from = Some(size.div_ceil(file.block_size));
        let syncs_whole = file
            .ctx
            .dns
            .attached()
            .iter()
            .all(|n| n.merge_writes() == 0);
        DataStreamer {
            file,
            block: None,
            crcs: Vec::new(),
            unsynced: Vec::new(),
            new_from,
            sent: 0,
            syncs: 0,
            synced_once: false,
            syncs_whole,
        }
    }

    /// The stream was fenced or its worker died: the replica files it had
    /// open are let go, and nothing is assumed about the blocks any more.
    pub fn reset(&mut self) {
        self.block = None;
        self.new_from = None;
    }

    /// Streams one packet through the pipeline (see [`OpenBlock::write`]).
    pub fn send(&mut self, p: &Packet) -> FsResult<()> {
        trip(p);
        self.open_block_at(p.off)?;
        let b = self.block.as_mut().expect("opened above");
        self.sent += p.data.len() as u64;
        let boff = p.off - b.start;
        self.crcs.clear();
        b.acc.crcs_for(boff, &p.data, &mut self.crcs);
        b.write(&self.file, boff, &p.data, &self.crcs)
    }

    /// The open block's range of file offsets, and how many bytes of
    /// queued packets may go to its replicas as one write (the most any
    /// of its datanodes asks for, [`crate::storage::Storage::merge_writes`]:
    /// a directory beside a bucket takes the larger writes as they come);
    /// `None` when no block is open or nothing is merged.
    pub fn merge_into(&self) -> Option<(std::ops::Range<u64>, usize)> {
        let b = self.block.as_ref()?;
        let dns = &self.file.ctx.dns;
        let cap = b
            .replicas
            .iter()
            .map(|r| dns.get(r.dn).map_or(0, |n| n.merge_writes()))
            .max()?;
        (cap > 0).then(|| (b.start..b.start + self.file.block_size, cap))
    }

    /// `len` zeros at `off` (within one block), as a hole on the replicas
    /// (see [`Self::grow`]).
    fn send_zeros(&mut self, off: u64, len: u64) -> FsResult<()> {
        self.open_block_at(off)?;
        let b = self.block.as_mut().expect("opened above");
        self.sent += len;
        let boff = off - b.start;
        self.crcs.clear();
        b.acc.crcs_for_zeros(boff, len, &mut self.crcs);
        b.write_zeros(&self.file, boff, len, &self.crcs)
    }

    /// Makes the open block the one file offset `off` goes into: the open
    /// one, or (once that is full) the next one, opened or created.
    fn open_block_at(&mut self, off: u64) -> FsResult<()> {
        let bs = self.file.block_size;
        let full = self.block.as_ref().is_some_and(|b| off >= b.start + bs);
        if full {
            let b = self.block.take().expect("checked above");
            self.finish(b)?;
        }
        if self.block.is_none() {
            let known_new = self.new_from.is_some_and(|n| off / bs >= n);
            self.block = Some(block::open(&self.file, off, known_new)?);
        }
        Ok(())
    }

    /// No block open: a close has nothing to finalise, only its record
    /// to commit (no replica I/O, no wait but the metadata store's).
    pub fn block_open(&self) -> bool {
        self.block.is_some()
    }

    /// Whether `p` can be written as a whole block at once (see
    /// [`Self::write_whole`]): it starts a block that no replica holds yet
    /// and none is open.
    pub fn takes_whole(&self, p: &Packet) -> bool {
        let bs = self.file.block_size;
        self.block.is_none()
            && !p.data.is_empty()
            && p.off.is_multiple_of(bs)
            && self.new_from.is_some_and(|n| p.off / bs >= n)
    }

    /// Whether an fsync right after a packet that [`Self::takes_whole`]
    /// writes it whole ([`Self::sync_whole`]): only where every datanode
    /// is a directory. On an object store a write after such an fsync
    /// would reopen the block by reading its tail back from the store
    /// (a GET, on the path of a write that a store cut then fails); there
    /// the block is opened for writing at the fsync, as before.
    /// Decided when the stream starts, from the datanodes attached then.
    pub fn syncs_whole(&self) -> bool {
        self.syncs_whole
    }

    /// The close of a file whose last block is all in `p`, its only
    /// packet (every small file): the block's replicas are written whole,
    /// straight into `finalized/`, for [`Self::record_closed_whole`],
    /// which records block and close in one commit. Where the metadata
    /// store keeps a block journal that record carries the block's bytes,
    /// and the datanodes may hold the replicas for its checkpoint as for
    /// an fsync ([`Self::sync_whole`]): the close then creates no file.
    pub fn write_whole(&mut self, p: &Packet) -> FsResult<Whole> {
        trip(p);
        let ctx = &self.file.ctx;
        // Only where every datanode is a directory, as for an fsync, and
        // where more than one replica is written: one replica's two files
        // the journal would only move to the checkpoint, with the row's
        // frames and a sync on top (no gain measured: benches/PROFILE.md,
        // "ninth look").
        let journaled =
            self.syncs_whole && ctx.dns.replication > 1 && ctx.journal.takes(&*ctx.meta);
        let (row, hold) = block::write_whole(
            &self.file,
            p.off / self.file.block_size,
            &p.data,
            &mut self.crcs,
            crate::metrics::Fast::OneStep,
            journaled,
        )?;
        // Closing promises no durability: a later fsync syncs it.
        self.unsynced.push(row.block_id);
        Ok(Whole {
            row,
            _hold: hold,
            journaled,
        })
    }

    /// Records `w`, the whole last block of the file with bytes `data`,
    /// and the file's close at `size` and `mtime`, in one commit.
    pub fn record_closed_whole(
        &mut self,
        w: Whole,
        data: &[u8],
        size: u64,
        mtime: Option<i64>,
    ) -> FsResult<()> {
        let journal = w.journaled.then_some(data);
        if let Err(e) = self.record_close(Some(&w.row), size, mtime, journal) {
            super::journal::write_out(&self.file.ctx, &w.row);
            return Err(e);
        }
        if w.journaled {
            super::journal::add(&self.file.ctx, &w.row);
        }
        Ok(())
    }

    /// The fsync of a file whose last block is all in `p`, its only
    /// packet: the block's replicas are written whole, straight into
    /// `finalized/` (as a close does, [`Self::write_whole`]), recorded as a
    /// finished block of the file under construction (one commit, as the
    /// block's opening would be), and synced with the metadata store as
    /// any fsync syncs a finished block. The file stays under
    /// construction, its writer's: a close records it closed without
    /// touching a replica, and a later write reopens the block for append
    /// as on a closed file. Where the metadata store keeps a block journal
    /// the record carries the block's bytes and the replicas are left to
    /// its checkpoint: the fsync is then one sync of the store's WAL.
    /// `mtime`: the file's modification time, recorded with the block.
    pub fn sync_whole(&mut self, p: &Packet, mtime: Option<i64>) -> FsResult<()> {
        // Commit and sync on the CPU that the sync's completion wakes.
        crate::sync_cpus::run(|| self.sync_whole_here(p, mtime))
    }

    fn sync_whole_here(&mut self, p: &Packet, mtime: Option<i64>) -> FsResult<()> {
        trip(p);
        let bs = self.file.block_size;
        let ctx = &self.file.ctx;
        let journaled = ctx.journal.takes(&*ctx.meta);
        let (row, _hold) = block::write_whole(
            &self.file,
            p.off / bs,
            &p.data,
            &mut self.crcs,
            crate::metrics::Fast::OneStepSynced,
            journaled,
        )?;
        let finished = FileOutcome::Finished {
            row: &row,
            size: p.end(),
            mtime,
            journal: journaled.then_some(&p.data[..]),
        };
        if let Err(e) = self.file.log.record(finished, false) {
            super::journal::write_out(ctx, &row);
            return Err(e);
        }
        if journaled {
            // Durable with the record: no sync of its replicas here.
            ctx.ledger.synced(self.file.ino, std::slice::from_ref(&row));
            super::journal::add(ctx, &row);
        } else {
            self.unsynced.push(row.block_id);
        }
        self.sent += p.data.len() as u64;
        self.new_from = Some(p.end().div_ceil(bs));
        self.sync()?;
        // A sync of this stream, for telling one that syncs often.
        self.syncs += 1;
        Ok(())
    }

    /// Finalises a full block and reports it with the length it implies.
    fn finish(&mut self, b: OpenBlock) -> FsResult<u64> {
        let done = block::finalize(&self.file, b, &mut self.unsynced)?;
        let finished = FileOutcome::Finished {
            row: &done.row,
            size: done.end,
            mtime: None,
            journal: None,
        };
        self.file.log.record(finished, false)?;
        Ok(done.end)
    }

    /// Reports the visible length, for readers on other daemons (only
    /// when the namespace is shared). On a lone daemon hflush needs no
    /// record: readers take the visible length from the stream, and
    /// recovery takes it from the replicas.
    pub fn publish_length(&self, size: u64, mtime: Option<i64>) -> FsResult<()> {
        if !self.file.ctx.publish_lengths {
            return Ok(());
        }
        let length = FileOutcome::Length { size, mtime };
        self.file.log.record(length, false).map(drop)
    }

    /// fsync: the replicas being written (through their writers), every
    /// other block of the file not known durable (those this stream
    /// finished since its last sync; the first time, every replica the
    /// ledger does not know durable), and the metadata store, all in
    /// parallel (see `durable`). A replica whose sync fails leaves its
    /// block; when a block keeps none, the fsync fails (and the stream
    /// with it: see `OutputStream`). Nothing new is recorded
    /// unless a replica failed: what must be kept (the file, its blocks
    /// and replicas, its under-construction record) was recorded when it
    /// changed, and the length of a file under construction is settled
    /// from its replicas by recovery.
    pub fn sync(&mut self) -> FsResult<()> {
        let ids = std::mem::take(&mut self.unsynced);
        let r = self.sync_with(&ids);
        if r.is_err() {
            self.unsynced.extend(ids);
        }
        r
    }

    fn sync_with(&mut self, ids: &[u64]) -> FsResult<()> {
        let f = &self.file;
        let ctx = &f.ctx;
        let whole = !self.synced_once;
        let open_id = self.block.as_ref().map(|b| b.row.block_id);
        let mut rows: Vec<BlockRow> = if whole || !ids.is_empty() {
            ctx.meta
                .blocks(f.ino)?
                .into_iter()
                .filter(|r| Some(r.block_id) != open_id && (whole || ids.contains(&r.block_id)))
                .collect()
        } else {
            Vec::new()
        };
        let mut replicas: Vec<Replica> = if whole {
            ctx.ledger.to_sync(f.ino, &rows)
        } else {
            durable::replicas_of(&rows).collect()
        };
        let plans = match self.block.as_mut() {
            Some(b) => plan_open(f, b, &mut replicas),
            None => OpenPlans::default(),
        };
        let OpenPlans {
            ranged,
            full,
            stashed,
            failed,
        } = plans;
        let block = self.block.as_ref();
        let per_file = |who: Replica| file_syncs(f, &stashed, &rows, who);
        let here = || ranged_syncs(f, block, ranged, failed);
        let results = durable::sync_replicas(ctx, replicas, per_file, full, here)?;
        let mut changed = durable::drop_failed(ctx, f.ino, &mut rows, &results)?;
        if let Some(b) = self.block.as_mut() {
            let mut open = [b.row.clone()];
            let left = durable::drop_failed(ctx, f.ino, &mut open, &results)?;
            if let Some(row) = left.into_iter().next() {
                b.replicas.retain(|r| row.replicas.contains(&r.dn));
                b.row.replicas = row.replicas.clone();
                changed.push(row);
            }
            for r in b.replicas.iter_mut() {
                r.w.synced();
            }
            b.synced = true;
        }
        if !changed.is_empty() {
            f.log.record(FileOutcome::Changed(&changed), true)?;
        }
        ctx.ledger.synced(f.ino, &rows);
        self.synced_once = true;
        Ok(())
    }

    /// After an fsync went through: a stream that syncs often (more than
    /// once, a few hundred KiB apart at most) keeps its replicas
    /// zero-filled ahead of it, so that its next syncs are ranged (see
    /// `storage::writer`). Runs after the fsync's reply, before the next
    /// job: its cost (zeros written and synced once per stretch) falls on
    /// that job's wait, not on the sync just done.
    pub fn after_sync(&mut self) {
        self.syncs += 1;
        let often = self.syncs >= 2 && self.sent / self.syncs <= SYNC_OFTEN_BELOW;
        let Some(b) = self.block.as_mut().filter(|_| often) else {
            return;
        };
        let dns = &self.file.ctx.dns;
        for r in b.replicas.iter_mut() {
            let len = r.w.len();
            if r.w.zeroed() >= len + ZERO_LOW || !dns.get(r.dn).is_some_and(|n| n.ranged_sync()) {
                continue;
            }
            let to = (len + ZERO_AHEAD).div_ceil(ZERO_STEP) * ZERO_STEP;
            if let Err(e) = r.w.extend_zeroed(to.min(self.file.block_size)) {
                // Its next syncs stay full ones; a failing disk shows in
                // the next write or sync, where it is handled.
                tracing::warn!(datanode = %r.dn, "cannot zero-fill a replica ahead: {e}");
            }
        }
    }

    /// Close, first half: finalises the last block (if one is open) and
    /// returns its row, for [`Self::record_closed`].
    pub fn finish_block(&mut self) -> FsResult<Option<BlockRow>> {
        let last = match self.block.take() {
            Some(b) => Some(block::finalize(&self.file, b, &mut self.unsynced)?.row),
            None => None,
        };
        Ok(last)
    }

    /// Close, second half: reports the file closed at `size` bytes with
    /// `last` its last block. The stream stays usable: a later write
    /// reopens the last block for append, as on a closed file.
    pub fn record_closed(
        &mut self,
        last: Option<BlockRow>,
        size: u64,
        mtime: Option<i64>,
    ) -> FsResult<()> {
        self.record_close(last.as_ref(), size, mtime, None)
    }

    /// The file closed at `size` and `mtime`, its last block `last`
    /// (with its bytes for the journal, `journal`), in one commit.
    fn record_close(
        &mut self,
        last: Option<&BlockRow>,
        size: u64,
        mtime: Option<i64>,
        journal: Option<&[u8]>,
    ) -> FsResult<()> {
        let closed = FileOutcome::Closed {
            last,
            size,
            mtime,
            journal,
        };
        self.file.log.record(closed, false)?;
        // As a stream that starts on a closed file of this length.
        self.new_from = Some(size.div_ceil(self.file.block_size));
        Ok(())
    }

    /// Truncate to `size`: drops whole blocks past it, cuts the block that
    /// holds it to the new length under a new generation stamp, or grows
    /// the file by streaming zeros. `mtime` gives the stream's time.
    pub fn truncate(&mut self, size: u64, mtime: &dyn Fn() -> i64) -> FsResult<()> {
        self.new_from = None;
        self.file.log.record(FileOutcome::Truncating, false)?;
        let cur = match self.block.take() {
            Some(b) => Some(self.finish(b)?),
            None => None,
        };
        let old = match cur {
            Some(c) => c,
            None => self.file.ctx.meta.get(self.file.ino)?.size,
        };
        if size >= old {
            return self.grow(old, size, mtime);
        }
        let f = &self.file;
        let bs = f.block_size;
        let mtime = mtime();
        // The block that holds the new end is cut under a new stamp.
        let mut cut = None;
        if !size.is_multiple_of(bs) {
            let idx = size / bs;
            if let Some(old) = f.ctx.meta.blocks(f.ino)?.into_iter().find(|b| b.idx == idx) {
                // Cut in place below: its bytes must be on disk first.
                super::journal::settle(&f.ctx, old.block_id)?;
                let mut new = old.clone();
                new.gs = f.ctx.meta.alloc(Counter::GenStamp)?;
                new.len = size - idx * bs;
                cut = Some(Cut { old, new });
            }
        }
        // Recorded first, durably; only then are the replicas of the
        // dropped blocks deleted and those of the cut block cut (a replica
        // may lag the record, never lead it, and none that a durable record
        // names is ever deleted).
        let shrunk = FileOutcome::Shrunk {
            size,
            mtime,
            drop_from: size.div_ceil(bs),
            cut: cut.as_ref().map(|c| &c.new),
        };
        let gone = f.log.record(shrunk, true)?;
        f.ctx.dns.delete_blocks(&gone);
        if let Some(Cut { old, new: mut rec }) = cut {
            let mut ok = Vec::new();
            for &dn in &old.replicas {
                let Some(node) = f.ctx.dns.get(dn) else {
                    continue;
                };
                match node.truncate(old.block_id, old.gs, rec.gs, rec.len) {
                    Ok(()) => ok.push(dn),
                    Err(e) => tracing::warn!(datanode = %dn, "replica truncate failed: {e}"),
                }
            }
            if !f.ctx.dns.any_shared(&ok) {
                return Err(FsError::Io("no replica could be truncated".into()));
            }
            self.unsynced.push(rec.block_id);
            if ok.len() < rec.replicas.len() {
                rec.replicas = ok;
                f.log
                    .record(FileOutcome::Changed(std::slice::from_ref(&rec)), false)?;
            }
        }
        Ok(())
    }

    /// Grows the file from `old` to `size` bytes with zeros, through the
    /// pipeline as holes (no zero byte is written, only the checksums,
    /// [`HOLE_PIECE`] at a time; a new block at each boundary), and
    /// reports the new length (with the stream's time once the zeros are
    /// in). The stream refused growth beyond what the datanodes could
    /// hold before it came here (see `Datanodes::growth_room`).
    fn grow(&mut self, old: u64, size: u64, mtime: &dyn Fn() -> i64) -> FsResult<()> {
        let bs = self.file.block_size;
        let mut off = old;
        while off < size {
            let n = (bs - off % bs).min(HOLE_PIECE).min(size - off);
            self.send_zeros(off, n)?;
            off += n;
        }
        let grown = FileOutcome::Grown {
            open: self.block.as_ref().map(|b| &b.row),
            size,
            mtime: mtime(),
        };
        self.file.log.record(grown, false).map(drop)
    }
}

/// The test hook that panics the stream's worker on a packet starting
/// with the trigger (tests/panics.rs), on every path a packet takes.
fn trip(p: &Packet) {
    crate::fault::panic_if("stream", || {
        p.data.starts_with(crate::fault::TRIGGER.as_bytes())
    });
}

/// Zeros of a truncate growth sent to the replicas at once: their
/// checksums (4 bytes per 512) are the only bytes written, 64 KiB a piece.
const HOLE_PIECE: u64 = 8 << 20;

/// How the open block's replicas are synced (see [`plan_open`]).
#[derive(Default)]
struct OpenPlans {
    /// Replicas synced ranged, by index in the block's pipeline, with the
    /// filesystem each is on.
    ranged: Vec<(usize, u64)>,
    /// Full syncs to run in parallel.
    full: Vec<SyncJob>,
    /// The full syncs of replicas that go to their filesystem's `syncfs`,
    /// in case it fails (then each replica is synced on its own).
    stashed: Mutex<HashMap<Replica, Vec<SyncTask>>>,
    /// Replicas whose sync could not even start.
    failed: Vec<Synced>,
}

/// Plans the sync of each replica of the open block `b`: ranged where its
/// files are zero-filled ahead and its filesystem allows it; else a full
/// one, through its filesystem's `syncfs` (added to `by_fs`) where that
/// is how replicas are synced, or through its own files.
fn plan_open(f: &StreamFile, b: &mut OpenBlock, by_fs: &mut Vec<Replica>) -> OpenPlans {
    let ctx = &f.ctx;
    let mut p = OpenPlans::default();
    for (k, r) in b.replicas.iter_mut().enumerate() {
        let who = Replica {
            block: b.row.block_id,
            dn: r.dn,
        };
        let node = ctx.dns.get(r.dn);
        let ranged = node.as_ref().is_some_and(|n| n.ranged_sync());
        match r.w.begin_sync(ranged) {
            Ok(SyncPlan::Clean) => {}
            Ok(SyncPlan::Ranged) => p.ranged.push((k, node.map_or(0, |n| n.fs_id()))),
            Ok(SyncPlan::Full(tasks)) => {
                if node.is_some_and(|n| ctx.sync_by_fs && n.syncfs_is_barrier()) {
                    by_fs.push(who);
                    lock(&p.stashed).insert(who, tasks);
                } else {
                    p.full.extend(tasks.into_iter().map(|t| task_job(who, t)));
                }
            }
            Err(e) => p.failed.push(Synced::own(who, Err(e.into()))),
        }
    }
    p
}

/// The ranged syncs of the open block `b` (by index, with their
/// filesystems): every replica's writeback waited for, then one cache
/// flush per filesystem, whose result is every replica's there. `failed`
/// comes first.
fn ranged_syncs(
    f: &StreamFile,
    b: Option<&OpenBlock>,
    mut ranged: Vec<(usize, u64)>,
    mut out: Vec<Synced>,
) -> Vec<Synced> {
    let Some(b) = b else { return out };
    let who = |k: usize| Replica {
        block: b.row.block_id,
        dn: b.replicas[k].dn,
    };
    ranged.sort_by_key(|&(_, fs)| fs);
    for group in ranged.chunk_by(|a, b| a.1 == b.1) {
        let mut waited = Vec::new();
        for &(k, _) in group {
            match b.replicas[k].w.end_ranged() {
                Ok(()) => waited.push(k),
                Err(e) => out.push(Synced::own(who(k), Err(e.into()))),
            }
        }
        let Some(&first) = waited.first() else {
            continue;
        };
        let flushed = b.replicas[first].w.flush().map_err(FsError::from);
        if let Err(e) = &flushed {
            tracing::warn!(ino = f.ino, "cache flush of a datanode's disk failed: {e}");
        }
        out.extend(
            waited
                .into_iter()
                .map(|k| Synced::own(who(k), flushed.clone())),
        );
    }
    out
}

fn task_job(who: Replica, t: SyncTask) -> SyncJob {
    durable::job(who, Box::new(move || t.run().map_err(FsError::from)))
}

/// The per-file syncs that make one replica durable: the full sync its
/// writer planned (data, checksums, and the directory the first time)
/// when it is a replica of the open block, else those of the closed
/// replica at the stamp `rows` record.
fn file_syncs(
    f: &StreamFile,
    stashed: &Mutex<HashMap<Replica, Vec<SyncTask>>>,
    rows: &[BlockRow],
    who: Replica,
) -> FsResult<Vec<SyncJob>> {
    if let Some(tasks) = lock(stashed).remove(&who) {
        return Ok(tasks.into_iter().map(|t| task_job(who, t)).collect());
    }
    Ok(rows
        .iter()
        .find(|r| r.block_id == who.block)
        .map(|r| durable::closed_replica_syncs(&f.ctx, who, r.gs))
        .unwrap_or_default())
}
