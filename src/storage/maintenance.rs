//! What housekeeping, fsck and the balancer do to a datanode beyond the
//! write path: listing its replicas, deleting them, copying one from
//! another datanode (re-replication, pipeline spares, moves), cleaning
//! `tmp/`, and the heartbeat probe; plus what a directory holds before it
//! is attached.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::api::Storage;
use super::checksum::{CHUNK_SIZE, chunk_crcs, crc_offset, encode_header};
use super::error::StorageError;
use super::fsops::{fsync_dir, remove_found, remove_if_exists, rename};
use super::identity::{self, Identity};
use super::layout::{FileName, Found, Layout, MetaFile, ReplicaInfo, ReplicaState, parse_name};
use super::locate::{self, metas_of, remove_files};
use super::reader::ReplicaReader;
use crate::sync::{AtomicU64, Ordering};

/// Makes temp-file names unique between threads of this process.
static TMP_SEQ: AtomicU64 = AtomicU64::new(0);

/// Every replica on the datanode (both files present), by block id. Files
/// of unknown names are ignored.
pub(crate) fn list(l: &Layout) -> Result<Vec<ReplicaInfo>, StorageError> {
    let mut blocks: BTreeMap<u64, Found> = BTreeMap::new();
    for s in ReplicaState::ALL {
        let dir = l.dir(s);
        let entries = fs::read_dir(dir).map_err(|e| StorageError::io(dir, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| StorageError::io(dir, e))?;
            let name = entry.file_name();
            let Some(parsed) = name.to_str().and_then(parse_name) else {
                continue;
            };
            match parsed {
                FileName::Data(block) => match entry.metadata() {
                    Ok(m) => blocks.entry(block).or_default().data[s.idx()] = Some(m.len()),
                    // Removed since read_dir.
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(StorageError::io(&entry.path(), e)),
                },
                FileName::Meta { block, gs } => {
                    let meta = MetaFile { gs, dir: s };
                    blocks.entry(block).or_default().metas.push(meta);
                }
            }
        }
    }
    Ok(blocks
        .iter()
        .filter_map(|(&block, found)| found.pick(l, block))
        .collect())
}

/// Deletes the replica of `block` recorded at generation stamp `gs`: four
/// unlinks at most, where deleting every file of the block must list both
/// directories to find the meta file (a cost that grows with the number
/// of replicas, so deleting many files was quadratic). Falls back to that
/// when the recorded meta file is not there.
pub(crate) fn delete_recorded(l: &Layout, block: u64, gs: u64) -> Result<(), StorageError> {
    let mut found = false;
    for s in ReplicaState::ALL {
        found |= remove_found(&l.meta_path(s, block, gs))?;
    }
    if !found {
        return locate::delete(l, block);
    }
    for s in ReplicaState::ALL {
        remove_if_exists(&l.data_path(s, block))?;
    }
    remove_if_exists(&l.note_path(block))
}

/// Copies the first `len` bytes of replica `block`@`gs` from `src`
/// (verified while read) with their checksums into `tmp/`, makes the copy
/// durable, removes any other files of the block here, and renames the
/// copy into `rbw/` or `finalized/` as `state` says.
pub(crate) fn copy_replica_from(
    l: &Layout,
    src: &dyn Storage,
    block: u64,
    gs: u64,
    len: u64,
    state: ReplicaState,
) -> Result<(), StorageError> {
    copy_replica_as(l, src, (block, gs), (block, gs), len, state)
}

/// As [`copy_replica_from`], the copy made replica `to` (block, stamp)
/// here: a block that lease recovery gives a new id, so that its next
/// writer shares no file with the writer that lost it.
pub(crate) fn copy_replica_as(
    l: &Layout,
    src: &dyn Storage,
    (block, gs): (u64, u64),
    (to, to_gs): (u64, u64),
    len: u64,
    state: ReplicaState,
) -> Result<(), StorageError> {
    let reader = src.open_reader(block, gs)?;
    let seq = TMP_SEQ.fetch_add(1, Ordering::Relaxed);
    let pid = std::process::id();
    let tmp_data = l.tmp().join(format!("blk_{to}.{pid}.{seq}.data"));
    let tmp_meta = l.tmp().join(format!("blk_{to}.{pid}.{seq}.meta"));
    let result = copy_into_tmp(&reader, len, &tmp_data, &tmp_meta);
    let result = result.and_then(|()| {
        replace_older(l, to, to_gs)?;
        rename(&tmp_data, &l.data_path(state, to))?;
        rename(&tmp_meta, &l.meta_path(state, to, to_gs))?;
        fsync_dir(l.dir(state))
    });
    if result.is_err() {
        let _ = fs::remove_file(&tmp_data);
        let _ = fs::remove_file(&tmp_meta);
    }
    result
}

/// Clears the way for a copy of `block`@`gs`: every file of the block
/// goes, which is right for stale leftovers and wrong for the live replica
/// of a writer that reopened the block (at a newer stamp) after the copy
/// was planned: replacing that would lose what it fsynced. One listing
/// serves the check and the removal.
fn replace_older(l: &Layout, block: u64, gs: u64) -> Result<(), StorageError> {
    let metas = metas_of(l, block)?;
    if let Some(found) = metas.iter().map(|m| m.gs).max().filter(|f| *f > gs) {
        return Err(StorageError::NewerReplica {
            block,
            found,
            copying: gs,
        });
    }
    remove_files(l, block, &metas)
}

fn copy_into_tmp(
    reader: &ReplicaReader,
    len: u64,
    tmp_data: &Path,
    tmp_meta: &Path,
) -> Result<(), StorageError> {
    let create = |p: &Path| {
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(p)
            .map_err(|e| StorageError::io(p, e))
    };
    let data = create(tmp_data)?;
    let meta = create(tmp_meta)?;
    meta.write_all_at(&encode_header(), 0)
        .map_err(|e| StorageError::io(tmp_meta, e))?;
    // A multiple of the chunk size, so each piece's CRCs are whole.
    const PIECE: u64 = 1 << 20;
    const _: () = assert!(PIECE.is_multiple_of(CHUNK_SIZE as u64));
    let mut buf = vec![0u8; PIECE.min(len) as usize];
    let mut crcs = Vec::new();
    let mut meta_buf = Vec::new();
    let mut off = 0u64;
    while off < len {
        let want = PIECE.min(len - off) as usize;
        let n = reader.read(off, &mut buf[..want])?;
        if n < want {
            return Err(StorageError::TooShort {
                block: reader.block(),
                replica: reader.data_path().to_path_buf(),
                len: off + n as u64,
                wanted: len,
            });
        }
        data.write_all_at(&buf[..n], off)
            .map_err(|e| StorageError::io(tmp_data, e))?;
        crcs.clear();
        chunk_crcs(&buf[..n], &mut crcs);
        meta_buf.clear();
        meta_buf.extend(crcs.iter().flat_map(|c| c.to_be_bytes()));
        meta.write_all_at(&meta_buf, crc_offset(off / CHUNK_SIZE as u64))
            .map_err(|e| StorageError::io(tmp_meta, e))?;
        off += n as u64;
    }
    data.sync_all().map_err(|e| StorageError::io(tmp_data, e))?;
    meta.sync_all().map_err(|e| StorageError::io(tmp_meta, e))
}

/// Removes everything left in `tmp/` (copies interrupted by a crash).
/// Call when no copy is running, e.g. at mount. Returns how many files
/// were removed.
pub(crate) fn clean_tmp(l: &Layout) -> Result<usize, StorageError> {
    let tmp = l.tmp();
    let entries = fs::read_dir(tmp).map_err(|e| StorageError::io(tmp, e))?;
    let mut n = 0;
    for entry in entries {
        let entry = entry.map_err(|e| StorageError::io(tmp, e))?;
        remove_if_exists(&entry.path())?;
        n += 1;
    }
    Ok(n)
}

/// The datanode heartbeat: proves the directory is still the datanode
/// `identity` names (its identity file) and can be written (a small probe
/// file in `tmp/` is written, fsynced and removed), and returns the bytes
/// free for unprivileged use. A full disk fails the probe with
/// [`StorageError::NoSpace`]: the caller counts that as full, not dead.
pub(crate) fn heartbeat(l: &Layout, identity: Option<&Identity>) -> Result<u64, StorageError> {
    let root = l.root();
    // A datanode whose directory came back (recreated, remounted) gets its
    // layout and identity file again; a root that is gone stays dead
    // rather than being recreated on whatever filesystem lies below it,
    // and a directory that now holds another datanode is never taken for
    // this one.
    if root.is_dir() {
        if let Some(want) = identity {
            let found = match identity::read(root)? {
                Some(found) => found,
                None => identity::create(root, want)?,
            };
            if found.storage_id != want.storage_id || found.filesystem_id != want.filesystem_id {
                return Err(StorageError::OtherIdentity {
                    path: root.to_path_buf(),
                    found: found.storage_id,
                    wanted: want.storage_id.clone(),
                });
            }
        }
        for d in [
            l.tmp(),
            l.dir(ReplicaState::Rbw),
            l.dir(ReplicaState::Finalized),
        ] {
            fs::create_dir_all(d).map_err(|e| StorageError::io(d, e))?;
        }
    }
    let seq = TMP_SEQ.fetch_add(1, Ordering::Relaxed);
    let probe = l
        .tmp()
        .join(format!(".heartbeat.{}.{seq}", std::process::id()));
    let written = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&probe)
        .and_then(|f| {
            f.write_all_at(b"leasefs heartbeat\n", 0)?;
            f.sync_all()
        });
    let removed = fs::remove_file(&probe);
    written.map_err(|e| StorageError::io(&probe, e))?;
    removed.map_err(|e| StorageError::io(&probe, e))?;
    free_bytes(root)
}

/// Bytes free for unprivileged use on the filesystem holding `root`.
pub fn free_bytes(root: &Path) -> Result<u64, StorageError> {
    let st =
        nix::sys::statvfs::statvfs(root).map_err(|e| StorageError::io(root, io::Error::from(e)))?;
    Ok((st.blocks_available() as u64).saturating_mul(st.fragment_size() as u64))
}

/// The blocks whose data files `root`'s `rbw/` and `finalized/` hold, read
/// without changing anything (the directory is not attached yet).
pub fn block_ids_in(root: &Path) -> Result<BTreeSet<u64>, StorageError> {
    let mut ids = BTreeSet::new();
    for s in ReplicaState::ALL {
        let dir = root.join(s.dir_name());
        let entries = match fs::read_dir(&dir) {
            Ok(it) => it,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(StorageError::io(&dir, e)),
        };
        for entry in entries {
            let entry = entry.map_err(|e| StorageError::io(&dir, e))?;
            if let Some(FileName::Data(b)) = entry.file_name().to_str().and_then(parse_name) {
                ids.insert(b);
            }
        }
    }
    Ok(ids)
}

/// Whether `root`'s `rbw/` or `finalized/` holds any file: a directory
/// without an identity file that holds some is never taken for a new
/// datanode.
pub fn holds_files(root: &Path) -> Result<bool, StorageError> {
    for s in ReplicaState::ALL {
        let dir = root.join(s.dir_name());
        match fs::read_dir(&dir) {
            Ok(mut it) => {
                if it.next().is_some() {
                    return Ok(true);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(StorageError::io(&dir, e)),
        }
    }
    Ok(false)
}
