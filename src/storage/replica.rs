//! The life of a replica on disk: created in `rbw/`, reopened for append or
//! pipeline recovery, restamped, cut, and moved to `finalized/`. Each step
//! is safe to retry after success (recovery and repairs run again after a
//! crash). What is made durable where is stated per step: closing a file
//! promises no durability, truncation does.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::checksum::{
    CHUNK_SIZE, META_HEADER_LEN, crc, crc_offset, encode_header, longest_matching_prefix,
    meta_len_for,
};
use super::error::StorageError;
use super::fsops::{file_len, read_full_at};
use super::layout::{Layout, ReplicaState};
use super::locate::{self, locate};
use super::note::Note;
use super::writer::{ReplicaFiles, ReplicaWriter};
use crate::metrics::IoCounters;
use crate::sync::Arc;

const CS: u64 = CHUNK_SIZE as u64;

/// Creates a new, empty replica in `rbw/`. Leftover files of the same
/// block (an earlier attempt that crashed) are removed first.
pub(crate) fn create_rbw(
    l: &Layout,
    io: &Arc<IoCounters>,
    block: u64,
    gs: u64,
) -> Result<ReplicaWriter, StorageError> {
    let data_at = l.data(ReplicaState::Rbw, block);
    let data_path = data_at.path.clone();
    let create = || data_at.create_new();
    if l.data(ReplicaState::Finalized, block).exists()? {
        tracing::warn!(dn = %l.id, block, "removing a leftover finalized replica");
        locate::delete(l, block)?;
    }
    let data = match create() {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            tracing::warn!(dn = %l.id, block, "removing a leftover rbw replica");
            locate::delete(l, block)?;
            create().map_err(|e| StorageError::io(&data_path, e))?
        }
        Err(e) => return Err(StorageError::io(&data_path, e)),
    };
    let meta_at = l.meta(ReplicaState::Rbw, block, gs);
    let meta = meta_at
        .create(true)
        .and_then(|m| {
            m.write_all_at(&encode_header(), 0)
                .map_err(|e| StorageError::io(&meta_at.path, e))
                .map(|()| m)
        })
        .inspect_err(|_| {
            // Best effort: no data file without checksums left behind.
            let _ = data_at.remove_found();
            let _ = meta_at.remove_found();
        })?;
    // A note of an earlier attempt at the block says nothing of this one.
    let note = l.note(block);
    note.remove_if_exists()?;
    let files = ReplicaFiles {
        data,
        meta,
        data_path,
        meta_path: meta_at.path,
        note,
    };
    Ok(ReplicaWriter::new(block, files, 0, Vec::new(), io))
}

/// Writes a whole replica of `block`@`gs` straight into `finalized/`: the
/// data file, then the meta file (header and `crcs` in one write), each
/// created anew. A crash part way leaves an unrecorded block's files,
/// which the orphan sweeps remove; nothing is synced here (see
/// [`finalize`]). Leftover files of the block (an earlier attempt) are
/// removed first.
pub(crate) fn write_finalized(
    l: &Layout,
    block: u64,
    gs: u64,
    data: &[u8],
    crcs: &[u32],
) -> Result<(), StorageError> {
    let data_at = l.data(ReplicaState::Finalized, block);
    let data_path = &data_at.path;
    let file = match data_at.create_new() {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            tracing::warn!(dn = %l.id, block, "removing a leftover replica");
            locate::delete(l, block)?;
            data_at
                .create_new()
                .map_err(|e| StorageError::io(data_path, e))?
        }
        Err(e) => return Err(StorageError::io(data_path, e)),
    };
    let meta_at = l.meta(ReplicaState::Finalized, block, gs);
    let mut meta = Vec::with_capacity(META_HEADER_LEN as usize + crcs.len() * 4);
    meta.extend_from_slice(&encode_header());
    for c in crcs {
        meta.extend_from_slice(&c.to_be_bytes());
    }
    let r = file
        .write_all_at(data, 0)
        .map_err(|e| StorageError::io(data_path, e))
        .and_then(|()| {
            meta_at.create(true).and_then(|m| {
                m.write_all_at(&meta, 0)
                    .map_err(|e| StorageError::io(&meta_at.path, e))
            })
        });
    if r.is_err() {
        // Best effort: no half replica left behind.
        let _ = data_at.remove_found();
        let _ = meta_at.remove_found();
    }
    r
}

/// Continues writing a replica at length `len`: an rbw replica (pipeline
/// recovery) or a finalized one, moved back into `rbw/` (append). Cuts the
/// data to `len` and the checksums to match, fixing the CRC of a partial
/// last chunk; the writer's resume tail then gives that chunk's bytes.
pub(crate) fn reopen_rbw(
    l: &Layout,
    io: &Arc<IoCounters>,
    block: u64,
    gs: u64,
    len: u64,
) -> Result<ReplicaWriter, StorageError> {
    let loc = locate(l, block, gs)?;
    let cur_data = l.data(loc.data_in, block);
    let cur_meta = l.meta(loc.meta_in, block, gs);
    // Check and cut the replica where it is, so that a replica that
    // cannot be reopened stays as it was; the descriptors follow the
    // renames below.
    let data = cur_data.open_rw()?;
    let meta = cur_meta.open_rw()?;
    let tail = shrink(
        l,
        block,
        (&data, &cur_data.path),
        (&meta, &cur_meta.path),
        len,
    )?;
    let data_at = l.data(ReplicaState::Rbw, block);
    let meta_at = l.meta(ReplicaState::Rbw, block, gs);
    // The first append into a partial last chunk rewrites its CRC in
    // place. Unless a note already vouches for the chunk as it is (the
    // last sync of the writer before ended here), one must be durable
    // first: a truncation to inside a chunk, or a cut that kept the new
    // CRC and not the bytes, would otherwise cost every replica the
    // durable bytes of the chunk.
    let note_at = l.note(block);
    let note = (!len.is_multiple_of(CHUNK_SIZE as u64)).then(|| Note {
        len,
        crc: crc(&tail),
    });
    let to_write = note.filter(|n| Note::read(&note_at) != Some(*n));
    // The note, the move to `rbw/` and its two directory syncs are each
    // durable before this returns (before any byte is appended), in no
    // order among themselves: a note beside a finalized replica is what
    // every close leaves anyway. So their syncs run at once, and an
    // append to a closed file waits for one sync of this disk, not three.
    std::thread::scope(|s| {
        let note_at = &note_at;
        let noting = to_write.map(|n| s.spawn(move || n.write_durably(note_at)));
        let moved = (|| {
            if loc.data_in == ReplicaState::Finalized {
                cur_data.rename_to(&data_at)?;
            }
            if loc.meta_in == ReplicaState::Finalized {
                cur_meta.rename_to(&meta_at)?;
            }
            if loc.any_finalized() {
                let rbw = s.spawn(|| l.fsync_dir(ReplicaState::Rbw));
                let finalized = l.fsync_dir(ReplicaState::Finalized);
                joined(rbw).and(finalized)?;
            }
            Ok(())
        })();
        let noted = noting.map_or(Ok(()), joined);
        moved.and(noted)
    })?;
    let files = ReplicaFiles {
        data,
        meta,
        data_path: data_at.path,
        meta_path: meta_at.path,
        note: note_at,
    };
    Ok(ReplicaWriter::new(block, files, len, tail, io).with_note(note))
}

/// The result of a sync run on a scoped thread; a panic there is this
/// replica's I/O error, not the daemon's.
fn joined(
    h: std::thread::ScopedJoinHandle<'_, Result<(), StorageError>>,
) -> Result<(), StorageError> {
    h.join().unwrap_or_else(|_| {
        Err(StorageError::io(
            Path::new("(replica sync)"),
            std::io::Error::other("a sync thread panicked"),
        ))
    })
}

/// Moves a replica from `rbw/` to `finalized/` (data, then meta), after
/// cutting it to `len` if longer. Nothing is synced here: closing a file
/// promises no durability (as on a local filesystem), and a rename lost in
/// a crash leaves an rbw replica that recovery finalises again; `fsync` of
/// the file syncs the replica (`sync_replica`).
pub(crate) fn finalize(l: &Layout, block: u64, gs: u64, len: u64) -> Result<(), StorageError> {
    let loc = locate(l, block, gs)?;
    let data_at = l.data(loc.data_in, block);
    let meta_at = l.meta(loc.meta_in, block, gs);
    let data_len = data_at.stat_len()?;
    let meta_len = meta_at.stat_len()?;
    if data_len != len || meta_len != meta_len_for(len) {
        let data = data_at.open_rw()?;
        let meta = meta_at.open_rw()?;
        shrink(
            l,
            block,
            (&data, &data_at.path),
            (&meta, &meta_at.path),
            len,
        )?;
    }
    if loc.data_in == ReplicaState::Rbw {
        data_at.rename_to(&l.data(ReplicaState::Finalized, block))?;
    }
    if loc.meta_in == ReplicaState::Rbw {
        meta_at.rename_to(&l.meta(ReplicaState::Finalized, block, gs))?;
    }
    Ok(())
}

/// Finalizes a replica a writer has just written, `written` bytes long
/// (the writer is closed): when that is exactly `len`, the files are
/// where the writer left them, so this is two renames and no lookups.
/// Anything unexpected (a file moved, a different length) goes the careful
/// way, through [`finalize`].
pub(crate) fn finalize_written(
    l: &Layout,
    written: u64,
    block: u64,
    gs: u64,
    len: u64,
) -> Result<(), StorageError> {
    if written == len
        && l.data(ReplicaState::Rbw, block)
            .try_rename_to(&l.data(ReplicaState::Finalized, block))
            .is_ok()
        && l.meta(ReplicaState::Rbw, block, gs)
            .try_rename_to(&l.meta(ReplicaState::Finalized, block, gs))
            .is_ok()
    {
        return Ok(());
    }
    finalize(l, block, gs, len)
}

/// Renames the meta file to a new generation stamp, so that replicas left
/// out of a rebuilt pipeline are recognisably stale. Retrying after
/// success is a no-op.
pub(crate) fn bump_gs(
    l: &Layout,
    block: u64,
    old_gs: u64,
    new_gs: u64,
) -> Result<(), StorageError> {
    let loc = match locate(l, block, old_gs) {
        Ok(loc) => loc,
        Err(StorageError::StaleGenStamp { found, .. }) if found == new_gs => return Ok(()),
        Err(e) => return Err(e),
    };
    if old_gs == new_gs {
        return Ok(());
    }
    // Not synced: the next sync of the replica's writer syncs its
    // directory, and a lost rename leaves a recognisably stale replica.
    l.meta(loc.meta_in, block, old_gs)
        .rename_to(&l.meta(loc.meta_in, block, new_gs))
}

/// Shrinks a replica (rbw or finalized) to `len` (HDFS truncate, lease
/// recovery): cuts the data, recomputes the CRC of a partial last chunk,
/// trims the checksums, makes that durable, then renames the meta file to
/// `new_gs`. Retrying after success is a no-op.
pub(crate) fn truncate(
    l: &Layout,
    block: u64,
    gs: u64,
    new_gs: u64,
    len: u64,
) -> Result<(), StorageError> {
    let (loc, cur_gs) = match locate(l, block, gs) {
        Ok(loc) => (loc, gs),
        Err(StorageError::StaleGenStamp { found, .. }) if found == new_gs => {
            (locate(l, block, new_gs)?, new_gs)
        }
        Err(e) => return Err(e),
    };
    let data_at = l.data(loc.data_in, block);
    let meta_at = l.meta(loc.meta_in, block, cur_gs);
    let (data_path, meta_path) = (&data_at.path, &meta_at.path);
    let data = data_at.open_rw()?;
    let meta = meta_at.open_rw()?;
    shrink(l, block, (&data, data_path), (&meta, meta_path), len)?;
    data.sync_data()
        .map_err(|e| StorageError::io(data_path, e))?;
    meta.sync_data()
        .map_err(|e| StorageError::io(meta_path, e))?;
    if cur_gs != new_gs {
        meta_at.rename_to(&l.meta(loc.meta_in, block, new_gs))?;
        l.fsync_dir(loc.meta_in)?;
    }
    Ok(())
}

/// Cuts a replica to `len` bytes: fixes the CRC of a new partial last chunk
/// (after checking the old one, so truncation never blesses corrupt bytes),
/// then shrinks the data and the meta file. Returns the bytes of the partial
/// last chunk. Both files must be open for reading and writing.
fn shrink(
    l: &Layout,
    block: u64,
    (data, data_path): (&File, &Path),
    (meta, meta_path): (&File, &Path),
    len: u64,
) -> Result<Vec<u8>, StorageError> {
    let data_len = file_len(data, data_path)?;
    if data_len < len {
        return Err(StorageError::TooShort {
            block,
            replica: data_path.to_path_buf(),
            len: data_len,
            wanted: len,
        });
    }
    let meta_len = file_len(meta, meta_path)?;
    let target = meta_len_for(len);
    if meta_len < target {
        return Err(StorageError::BadMeta {
            path: meta_path.to_path_buf(),
            reason: format!("{meta_len} bytes of checksums, {len} bytes of data need {target}"),
        });
    }
    let part = (len % CS) as usize;
    let mut tail = Vec::new();
    if part != 0 {
        let cs = len - part as u64;
        let chunk_end = (cs + CS).min(data_len);
        let mut chunk = [0u8; CHUNK_SIZE];
        let n = read_full_at(data, &mut chunk[..(chunk_end - cs) as usize], cs)
            .map_err(|e| StorageError::io(data_path, e))?;
        let mut c = [0u8; 4];
        let at = crc_offset(cs / CS);
        meta.read_exact_at(&mut c, at)
            .map_err(|e| StorageError::io(meta_path, e))?;
        let stored = u32::from_be_bytes(c);
        // The bytes kept must check out: against the chunk's checksum, or
        // against the sync note when an append's new checksum of the chunk
        // reached the disk and its bytes did not.
        let noted = || {
            Note::read(&l.note(block))
                .and_then(|note| note.covers(cs, &chunk[..n]))
                .is_some_and(|p| p >= part)
        };
        if longest_matching_prefix(&chunk[..n], part, stored).is_none() && !noted() {
            return Err(StorageError::Corrupt {
                block,
                replica: data_path.to_path_buf(),
                offset: cs,
            });
        }
        let fixed = crc(&chunk[..part]);
        if fixed != stored {
            // Before cutting the data: a crash in between leaves a CRC
            // that still matches a prefix of the longer data.
            meta.write_all_at(&fixed.to_be_bytes(), at)
                .map_err(|e| StorageError::io(meta_path, e))?;
        }
        tail.extend_from_slice(&chunk[..part]);
    }
    if data_len > len || meta_len > target {
        // What lies below the cut may have been written over zeros a writer
        // filled its files with, and not synced: those are overwrites of
        // blocks the files have, which the filesystem may write back after
        // the smaller size reached the disk (a journal commits a truncation
        // on its own schedule). A power cut in between would leave a
        // replica of the new length with zeros inside: synced first.
        for (file, path) in [(data, data_path), (meta, meta_path)] {
            file.sync_data().map_err(|e| StorageError::io(path, e))?;
        }
    }
    if data_len > len {
        data.set_len(len)
            .map_err(|e| StorageError::io(data_path, e))?;
    }
    if meta_len > target {
        meta.set_len(target)
            .map_err(|e| StorageError::io(meta_path, e))?;
    }
    Ok(tail)
}
