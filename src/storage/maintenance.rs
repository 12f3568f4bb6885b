//! What housekeeping, fsck and the balancer do to a datanode beyond the
//! write path: listing its replicas, deleting them, copying one from
//! another datanode (re-replication, pipeline spares, moves), cleaning
//! `tmp/`, and the heartbeat probe; plus what a directory holds before it
//! is attached.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::api::Storage;
use super::at::{At, DirFd, Dirs, Sub};
use super::checksum::{CHUNK_SIZE, chunk_crcs, crc_offset, encode_header};
use super::error::StorageError;
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
    let fds = l.fds();
    for s in ReplicaState::ALL {
        for name in fds.dir(s.into()).names()? {
            let Some(parsed) = parse_name(&name) else {
                continue;
            };
            match parsed {
                // `None`: removed since the listing.
                FileName::Data(block) => {
                    if let Some(st) = l.at(s.into(), name).lstat()? {
                        blocks.entry(block).or_default().data[s.idx()] = Some(st.st_size as u64);
                    }
                }
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
        found |= l.meta(s, block, gs).remove_found()?;
    }
    if !found {
        return locate::delete(l, block);
    }
    for s in ReplicaState::ALL {
        l.data(s, block).remove_if_exists()?;
    }
    l.note(block).remove_if_exists()
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
    let tmp_data = l.at(Sub::Tmp, format!("blk_{to}.{pid}.{seq}.data"));
    let tmp_meta = l.at(Sub::Tmp, format!("blk_{to}.{pid}.{seq}.meta"));
    let result = copy_into_tmp(&reader, len, &tmp_data, &tmp_meta);
    let result = result.and_then(|()| {
        replace_older(l, to, to_gs)?;
        tmp_data.rename_to(&l.data(state, to))?;
        tmp_meta.rename_to(&l.meta(state, to, to_gs))?;
        l.fsync_dir(state)
    });
    if result.is_err() {
        let _ = tmp_data.remove_found();
        let _ = tmp_meta.remove_found();
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
    tmp_data_at: &At,
    tmp_meta_at: &At,
) -> Result<(), StorageError> {
    let data = tmp_data_at.create(true)?;
    let meta = tmp_meta_at.create(true)?;
    let (tmp_data, tmp_meta) = (&tmp_data_at.path, &tmp_meta_at.path);
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
    let mut n = 0;
    for name in l.fds().dir(Sub::Tmp).names()? {
        // Unlinked through `tmp/`'s descriptor: a link found there goes,
        // never what it points to.
        l.at(Sub::Tmp, name).remove_if_exists()?;
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
    // layout and identity file again, and the daemon holds its new
    // directories from now on; a root that is gone stays dead rather than
    // being recreated on whatever filesystem lies below it, a directory
    // that now holds another datanode is never taken for this one, and
    // one another user could change now is not used.
    let rootd = DirFd::open_trusted(root)?;
    if let Some(want) = identity {
        let found = match identity::read_in(&rootd)? {
            Some(found) => found,
            None => identity::create_in(&rootd, want)?,
        };
        if found.storage_id != want.storage_id || found.filesystem_id != want.filesystem_id {
            return Err(StorageError::OtherIdentity {
                path: root.to_path_buf(),
                found: found.storage_id,
                wanted: want.storage_id.clone(),
            });
        }
    }
    // The directories as the path gives them now are held from here on,
    // as checked above: a directory recreated, or a filesystem mounted
    // or made read-only over it, is what the next replica goes to (or
    // fails on), as it was when files were opened by path.
    let now = Dirs::open_in(rootd)?;
    if now.inodes != l.fds().inodes {
        tracing::info!(dn = %l.id, root = %root.display(), "datanode directory recreated: its new directories are used from now on");
    }
    l.replace_fds(now);
    let seq = TMP_SEQ.fetch_add(1, Ordering::Relaxed);
    let probe = l.at(Sub::Tmp, format!(".heartbeat.{}.{seq}", std::process::id()));
    let written = probe.create(true).and_then(|f| {
        f.write_all_at(b"leasefs heartbeat\n", 0)
            .and_then(|()| f.sync_all())
            .map_err(|e| StorageError::io(&probe.path, e))
    });
    let removed = probe.remove_if_exists();
    written?;
    removed?;
    probe.dirs.dir(Sub::Root).free_bytes()
}

/// Checks, changing nothing, that no user but the daemon's can change the
/// datanode directory `root`, a directory above it, or its `rbw/`,
/// `finalized/`, `tmp/` and `quarantine/` (a symbolic link there is
/// refused too): [`StorageError::Untrusted`] says why. A missing `root`
/// is an I/O error; missing directories in it are fine.
pub fn check_dirs(root: &Path) -> Result<(), StorageError> {
    let d = DirFd::open_trusted(root)?;
    for name in ["rbw", "finalized", "tmp", super::quarantine::DIR] {
        d.child_dir(name, false)?;
    }
    Ok(())
}

/// The names in `root`'s `rbw/` or `finalized/` (none when it has no
/// such directory), read through descriptors without following a link.
fn names_in(root: &Path, s: ReplicaState) -> Result<Vec<String>, StorageError> {
    match DirFd::open_trusted(root)?.child_dir(s.dir_name(), false)? {
        Some(d) => d.names(),
        None => Ok(Vec::new()),
    }
}

/// The blocks whose data files `root`'s `rbw/` and `finalized/` hold, read
/// without changing anything (the directory is not attached yet).
pub fn block_ids_in(root: &Path) -> Result<BTreeSet<u64>, StorageError> {
    let mut ids = BTreeSet::new();
    for s in ReplicaState::ALL {
        for name in names_in(root, s)? {
            if let Some(FileName::Data(b)) = parse_name(&name) {
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
        if !names_in(root, s)?.is_empty() {
            return Ok(true);
        }
    }
    Ok(false)
}
