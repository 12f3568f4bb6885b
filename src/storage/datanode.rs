//! A datanode: one storage directory holding block replicas.
//!
//! Layout: `DN/VERSION` (the directory's identity, see
//! [`super::identity`]), `DN/rbw/` (replicas being written),
//! `DN/finalized/` (finished replicas), `DN/tmp/` (copies in progress,
//! heartbeat probes). A replica of
//! block `id` with generation stamp `gs` is the data file `blk_<id>` and the
//! checksum file `blk_<id>_<gs>.meta` (see [`super::checksum`]), both in
//! `rbw/` or both in `finalized/`.
//!
//! Moving a replica between directories renames the data file, then the meta
//! file. A crash in between leaves them in different directories; lookups
//! find each file on its own (rbw first), and such a replica counts as being
//! written, so recovery finalizes it again.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use super::checksum::{CHUNK_SIZE, chunk_crcs, crc_offset, encode_header, meta_len_for};
use super::identity::{DnId, Identity};
/// Re-exported: the writer and reader of one replica live in
/// [`super::replica`].
pub use super::replica::{ReplicaReader, ReplicaWriter};
use super::replica::{fsync_dir, shrink};

mod health;
use crate::metrics::IoCounters;
use crate::sync::{Arc, AtomicU64, Ordering};

/// Errors of the storage layer; each variant carries the facts needed to
/// report it (which replica, which offset).
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("I/O error on {}: {source}", .path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("no space left on the device holding {}", .path.display())]
    NoSpace { path: PathBuf },
    #[error(
        "checksum mismatch in block {block}, replica {}, chunk at offset {offset}",
        .replica.display()
    )]
    Corrupt {
        block: u64,
        replica: PathBuf,
        offset: u64,
    },
    #[error("block {block} has no replica on datanode {dn}")]
    Missing { block: u64, dn: DnId },
    #[error("block {block}: replica has generation stamp {found}, wanted {wanted}")]
    StaleGenStamp { block: u64, found: u64, wanted: u64 },
    /// A copy would have replaced a replica newer than itself: a writer
    /// that reopened the block since the copy was planned owns it.
    #[error(
        "block {block}: the destination holds generation stamp {found}, newer than the copy's {copying}"
    )]
    NewerReplica {
        block: u64,
        found: u64,
        copying: u64,
    },
    #[error("bad checksum file {}: {reason}", .path.display())]
    BadMeta { path: PathBuf, reason: String },
    /// The replica holds fewer bytes than an operation needs.
    #[error("block {block}: replica {} holds {len} bytes, {wanted} needed", .replica.display())]
    TooShort {
        block: u64,
        replica: PathBuf,
        len: u64,
        wanted: u64,
    },
    /// An identity file that cannot be trusted (see [`super::identity`]).
    #[error("bad datanode identity file {}: {reason}", .path.display())]
    BadIdentity { path: PathBuf, reason: String },
    /// The directory holds another datanode than the one opened there.
    #[error("{} now holds another datanode ({found}, expected {wanted})", .path.display())]
    OtherIdentity {
        path: PathBuf,
        found: String,
        wanted: String,
    },
    /// A packet that does not continue the replica (caller bug).
    #[error("bad packet for {}: {reason}", .path.display())]
    BadPacket { path: PathBuf, reason: String },
}

impl StorageError {
    /// Wraps an I/O error on `path`; `ENOSPC` and `EDQUOT` become
    /// [`StorageError::NoSpace`].
    pub fn io(path: &Path, source: io::Error) -> Self {
        match source.raw_os_error() {
            Some(libc::ENOSPC) | Some(libc::EDQUOT) => StorageError::NoSpace {
                path: path.to_path_buf(),
            },
            _ => StorageError::Io {
                path: path.to_path_buf(),
                source,
            },
        }
    }

    /// The errno a FUSE reply should carry.
    pub fn errno(&self) -> i32 {
        match self {
            StorageError::NoSpace { .. } => libc::ENOSPC,
            StorageError::Io { .. }
            | StorageError::Corrupt { .. }
            | StorageError::Missing { .. }
            | StorageError::StaleGenStamp { .. }
            | StorageError::NewerReplica { .. }
            | StorageError::BadMeta { .. }
            | StorageError::BadIdentity { .. }
            | StorageError::OtherIdentity { .. }
            | StorageError::TooShort { .. }
            | StorageError::BadPacket { .. } => libc::EIO,
        }
    }
}

/// Where a replica lives: being written (`rbw/`) or finished (`finalized/`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum ReplicaState {
    Rbw,
    Finalized,
}

impl ReplicaState {
    /// Lookup order: a replica being written wins over a finalized one.
    const ALL: [ReplicaState; 2] = [ReplicaState::Rbw, ReplicaState::Finalized];

    /// The directory name under the datanode root.
    pub fn dir_name(self) -> &'static str {
        match self {
            ReplicaState::Rbw => "rbw",
            ReplicaState::Finalized => "finalized",
        }
    }

    fn idx(self) -> usize {
        match self {
            ReplicaState::Rbw => 0,
            ReplicaState::Finalized => 1,
        }
    }
}

/// One replica as found on disk.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ReplicaInfo {
    pub block: u64,
    pub gs: u64,
    /// `Finalized` only when both files are in `finalized/`.
    pub state: ReplicaState,
    pub data_len: u64,
    pub data_path: PathBuf,
    pub meta_path: PathBuf,
}

/// Data file name of a block.
pub fn data_name(block: u64) -> String {
    format!("blk_{block}")
}

/// Meta file name of a block at a generation stamp.
pub fn meta_name(block: u64, gs: u64) -> String {
    format!("blk_{block}_{gs}.meta")
}

/// A file name in `rbw/` or `finalized/`.
#[derive(Debug, PartialEq, Eq)]
enum FileName {
    Data(u64),
    Meta { block: u64, gs: u64 },
}

fn parse_name(name: &str) -> Option<FileName> {
    let rest = name.strip_prefix("blk_")?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    match rest.strip_suffix(".meta") {
        Some(m) => {
            let (b, g) = m.split_once('_')?;
            (digits(b) && digits(g)).then_some(())?;
            Some(FileName::Meta {
                block: b.parse().ok()?,
                gs: g.parse().ok()?,
            })
        }
        None => {
            digits(rest).then_some(())?;
            Some(FileName::Data(rest.parse().ok()?))
        }
    }
}

/// The files of one block found in both directories.
#[derive(Debug, Default)]
struct Found {
    /// Data file length, by directory (rbw, finalized).
    data: [Option<u64>; 2],
    /// Meta files: generation stamp and directory.
    metas: Vec<(u64, ReplicaState)>,
}

/// Both files of a replica with a known generation stamp.
struct Located {
    data_in: ReplicaState,
    meta_in: ReplicaState,
}

/// Makes temp-file names unique between threads of this process.
static TMP_SEQ: AtomicU64 = AtomicU64::new(0);

/// One storage directory.
#[derive(Debug)]
pub struct Datanode {
    /// The registry's id of this storage: what block rows record.
    pub id: DnId,
    pub root: PathBuf,
    /// The identity file the directory had when it was opened; heartbeats
    /// check that it still does.
    identity: Option<Identity>,
    /// `rbw/` and `finalized/`, indexed by [`ReplicaState::idx`].
    dirs: [PathBuf; 2],
    tmp: PathBuf,
    /// The root, held open for `syncfs`: its error cursor starts when the
    /// datanode is opened, so each writeback error there is reported once.
    root_fd: File,
    /// Device of the root: datanodes that share it share one `syncfs`.
    dev: u64,
    /// Replica bytes written and read here, and failures (`leasefs stats`).
    pub io: Arc<IoCounters>,
    /// Whether `syncfs(2)` makes this datanode's writes durable. Not on
    /// FUSE (sshfs, a FUSE-backed disk, leasefs's own power-cut test
    /// filesystem): the kernel sends FUSE_SYNCFS to virtiofs only, so on
    /// any other FUSE mount syncfs returns at once having asked the
    /// daemon nothing.
    syncfs_barrier: bool,
}

impl Datanode {
    /// Opens the datanode `id` at `root`, creating `rbw/`, `finalized/` and
    /// `tmp/` as needed. `identity` is what its identity file says (`None`
    /// only for directories used without one, as in unit tests).
    pub fn open(id: DnId, root: &Path, identity: Option<Identity>) -> Result<Self, StorageError> {
        let dirs = ReplicaState::ALL.map(|s| root.join(s.dir_name()));
        let tmp = root.join("tmp");
        for d in dirs.iter().chain([&tmp]) {
            fs::create_dir_all(d).map_err(|e| StorageError::io(d, e))?;
        }
        let root_fd = File::open(root).map_err(|e| StorageError::io(root, e))?;
        let dev = root_fd
            .metadata()
            .map_err(|e| StorageError::io(root, e))?
            .dev();
        let fs_type = nix::sys::statfs::fstatfs(&root_fd)
            .map_err(|e| StorageError::io(root, io::Error::from(e)))?
            .filesystem_type();
        let syncfs_barrier = fs_type != nix::sys::statfs::FUSE_SUPER_MAGIC;
        if !syncfs_barrier {
            tracing::info!(
                datanode = %id,
                root = %root.display(),
                "datanode on a FUSE filesystem, where syncfs does not reach the daemon: its replicas are synced file by file"
            );
        }
        Ok(Datanode {
            id,
            root: root.to_path_buf(),
            identity,
            dirs,
            tmp,
            root_fd,
            dev,
            io: Arc::default(),
            syncfs_barrier,
        })
    }

    /// Whether one `syncfs` makes this datanode's replicas durable (else
    /// each replica needs its own syncs).
    pub fn syncfs_is_barrier(&self) -> bool {
        self.syncfs_barrier
    }

    /// The storage ID of its identity file, if it has one.
    pub fn storage_id(&self) -> Option<&str> {
        self.identity.as_ref().map(|i| i.storage_id.as_str())
    }

    /// The filesystem this datanode lives on (its device number).
    pub fn fs_id(&self) -> u64 {
        self.dev
    }

    /// Makes everything written on this datanode's filesystem durable with
    /// one `syncfs(2)`: data, inodes and directory entries of every replica
    /// there, for one cache flush (and journal commit) where `fdatasync`
    /// per file pays one each. An error means some writeback on that
    /// filesystem failed since the last call, not necessarily ours: the
    /// caller finds out which file with per-file syncs.
    pub fn sync_fs(&self) -> Result<(), StorageError> {
        nix::unistd::syncfs(&self.root_fd)
            .map_err(|e| StorageError::io(&self.root, io::Error::from(e)))
    }

    /// The directory of replicas in `state`.
    pub fn dir(&self, state: ReplicaState) -> &Path {
        &self.dirs[state.idx()]
    }

    fn data_path(&self, state: ReplicaState, block: u64) -> PathBuf {
        self.dir(state).join(data_name(block))
    }

    fn meta_path(&self, state: ReplicaState, block: u64, gs: u64) -> PathBuf {
        self.dir(state).join(meta_name(block, gs))
    }

    /// Creates a new, empty replica in `rbw/`. Leftover files of the same
    /// block (an earlier attempt that crashed) are removed first.
    pub fn create_rbw(&self, block: u64, gs: u64) -> Result<ReplicaWriter, StorageError> {
        let data_path = self.data_path(ReplicaState::Rbw, block);
        let create = || {
            OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&data_path)
        };
        if exists(&self.data_path(ReplicaState::Finalized, block))? {
            tracing::warn!(
                dn = %self.id,
                block,
                "removing a leftover finalized replica"
            );
            self.delete(block)?;
        }
        let data = match create() {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                tracing::warn!(dn = %self.id, block, "removing a leftover rbw replica");
                self.delete(block)?;
                create().map_err(|e| StorageError::io(&data_path, e))?
            }
            Err(e) => return Err(StorageError::io(&data_path, e)),
        };
        let meta_path = self.meta_path(ReplicaState::Rbw, block, gs);
        let meta = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&meta_path)
            .and_then(|m| m.write_all_at(&encode_header(), 0).map(|()| m))
            .map_err(|e| {
                // Best effort: no data file without checksums left behind.
                let _ = fs::remove_file(&data_path);
                let _ = fs::remove_file(&meta_path);
                StorageError::io(&meta_path, e)
            })?;
        Ok(
            ReplicaWriter::new(block, data, meta, data_path, meta_path, 0, Vec::new())
                .counted(&self.io),
        )
    }

    /// Continues writing a replica at length `len`: an rbw replica (pipeline
    /// recovery) or a finalized one, moved back into `rbw/` (append). Cuts
    /// the data to `len` and the checksums to match, fixing the CRC of a
    /// partial last chunk; [`ReplicaWriter::take_resume_tail`] then gives
    /// that chunk's bytes.
    pub fn reopen_rbw(&self, block: u64, gs: u64, len: u64) -> Result<ReplicaWriter, StorageError> {
        let loc = self.locate(block, gs)?;
        let cur_data = self.data_path(loc.data_in, block);
        let cur_meta = self.meta_path(loc.meta_in, block, gs);
        // Check and cut the replica where it is, so that a replica that
        // cannot be reopened stays as it was; the descriptors follow the
        // renames below.
        let data = open_rw(&cur_data)?;
        let meta = open_rw(&cur_meta)?;
        let tail = shrink(block, &data, &cur_data, &meta, &cur_meta, len)?;
        let data_path = self.data_path(ReplicaState::Rbw, block);
        let meta_path = self.meta_path(ReplicaState::Rbw, block, gs);
        if loc.data_in == ReplicaState::Finalized {
            rename(&cur_data, &data_path)?;
        }
        if loc.meta_in == ReplicaState::Finalized {
            rename(&cur_meta, &meta_path)?;
        }
        if loc.data_in == ReplicaState::Finalized || loc.meta_in == ReplicaState::Finalized {
            fsync_dir(self.dir(ReplicaState::Rbw))?;
            fsync_dir(self.dir(ReplicaState::Finalized))?;
        }
        Ok(
            ReplicaWriter::new(block, data, meta, data_path, meta_path, len, tail)
                .counted(&self.io),
        )
    }

    /// The replica of `block`, if both of its files exist: the data file in
    /// `rbw/`, else in `finalized/`; the meta file with the highest
    /// generation stamp. I/O errors are logged and give `None` (see
    /// [`Self::lookup`]).
    pub fn find(&self, block: u64) -> Option<ReplicaInfo> {
        self.lookup(block).unwrap_or_else(|e| {
            tracing::warn!(dn = %self.id, block, error = %e, "replica lookup failed");
            None
        })
    }

    /// [`Self::find`], reporting I/O errors. Scans both directories for meta
    /// files, so it costs time proportional to the number of replicas.
    pub fn lookup(&self, block: u64) -> Result<Option<ReplicaInfo>, StorageError> {
        let mut found = Found::default();
        for s in ReplicaState::ALL {
            let p = self.data_path(s, block);
            match fs::symlink_metadata(&p) {
                Ok(m) => found.data[s.idx()] = Some(m.len()),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(StorageError::io(&p, e)),
            }
        }
        found.metas = self.metas_of(block)?;
        Ok(self.pick(block, &found))
    }

    /// Moves a replica from `rbw/` to `finalized/` (data, then meta), after
    /// cutting it to `len` if longer. Nothing is synced here: closing a file
    /// promises no durability (as on a local filesystem), and a rename lost
    /// in a crash leaves an rbw replica that recovery finalises again;
    /// `fsync` of the file calls [`Self::sync_replica`].
    pub fn finalize(&self, block: u64, gs: u64, len: u64) -> Result<(), StorageError> {
        let loc = self.locate(block, gs)?;
        let data_path = self.data_path(loc.data_in, block);
        let meta_path = self.meta_path(loc.meta_in, block, gs);
        let data_len = stat_len(&data_path)?;
        let meta_len = stat_len(&meta_path)?;
        if data_len != len || meta_len != meta_len_for(len) {
            let data = open_rw(&data_path)?;
            let meta = open_rw(&meta_path)?;
            shrink(block, &data, &data_path, &meta, &meta_path, len)?;
        }
        if loc.data_in == ReplicaState::Rbw {
            rename(&data_path, &self.data_path(ReplicaState::Finalized, block))?;
        }
        if loc.meta_in == ReplicaState::Rbw {
            rename(
                &meta_path,
                &self.meta_path(ReplicaState::Finalized, block, gs),
            )?;
        }
        Ok(())
    }

    /// Finalizes the replica that `w` has just written, when it holds
    /// exactly `len` bytes: the writer knows where its files are, so this is
    /// two renames and no lookups. Anything unexpected (a file moved, a
    /// different length) goes the careful way, through [`Self::finalize`].
    pub fn finalize_written(
        &self,
        w: ReplicaWriter,
        block: u64,
        gs: u64,
        len: u64,
    ) -> Result<(), StorageError> {
        let exact = w.len() == len;
        drop(w);
        if exact
            && fs::rename(
                self.data_path(ReplicaState::Rbw, block),
                self.data_path(ReplicaState::Finalized, block),
            )
            .is_ok()
            && fs::rename(
                self.meta_path(ReplicaState::Rbw, block, gs),
                self.meta_path(ReplicaState::Finalized, block, gs),
            )
            .is_ok()
        {
            return Ok(());
        }
        self.finalize(block, gs, len)
    }

    /// Makes a closed replica durable: data, checksums and both directory
    /// entries (for blocks finalised before an `fsync` of their file).
    pub fn sync_replica(&self, block: u64, gs: u64) -> Result<(), StorageError> {
        let loc = self.locate(block, gs)?;
        for p in [
            self.data_path(loc.data_in, block),
            self.meta_path(loc.meta_in, block, gs),
        ] {
            fs::File::open(&p)
                .and_then(|f| f.sync_all())
                .map_err(|e| StorageError::io(&p, e))?;
        }
        fsync_dir(self.dir(ReplicaState::Finalized))?;
        fsync_dir(self.dir(ReplicaState::Rbw))
    }

    /// Renames the meta file to a new generation stamp, so that replicas left
    /// out of a rebuilt pipeline are recognisably stale. Retrying after
    /// success is a no-op.
    pub fn bump_gs(&self, block: u64, old_gs: u64, new_gs: u64) -> Result<(), StorageError> {
        let loc = match self.locate(block, old_gs) {
            Ok(loc) => loc,
            Err(StorageError::StaleGenStamp { found, .. }) if found == new_gs => return Ok(()),
            Err(e) => return Err(e),
        };
        if old_gs == new_gs {
            return Ok(());
        }
        // Not synced: the next sync of the replica's writer syncs its
        // directory, and a lost rename leaves a recognisably stale replica.
        rename(
            &self.meta_path(loc.meta_in, block, old_gs),
            &self.meta_path(loc.meta_in, block, new_gs),
        )
    }

    /// Shrinks a replica (rbw or finalized) to `len` (HDFS truncate, lease
    /// recovery): cuts the data, recomputes the CRC of a partial last chunk,
    /// trims the checksums, makes that durable, then renames the meta file to
    /// `new_gs`. Retrying after success is a no-op.
    pub fn truncate(&self, block: u64, gs: u64, new_gs: u64, len: u64) -> Result<(), StorageError> {
        let (loc, cur_gs) = match self.locate(block, gs) {
            Ok(loc) => (loc, gs),
            Err(StorageError::StaleGenStamp { found, .. }) if found == new_gs => {
                (self.locate(block, new_gs)?, new_gs)
            }
            Err(e) => return Err(e),
        };
        let data_path = self.data_path(loc.data_in, block);
        let meta_path = self.meta_path(loc.meta_in, block, cur_gs);
        let data = open_rw(&data_path)?;
        let meta = open_rw(&meta_path)?;
        shrink(block, &data, &data_path, &meta, &meta_path, len)?;
        data.sync_data()
            .map_err(|e| StorageError::io(&data_path, e))?;
        meta.sync_data()
            .map_err(|e| StorageError::io(&meta_path, e))?;
        if cur_gs != new_gs {
            rename(&meta_path, &self.meta_path(loc.meta_in, block, new_gs))?;
            fsync_dir(self.dir(loc.meta_in))?;
        }
        Ok(())
    }

    /// Opens a replica with generation stamp `gs` for verified reads.
    /// [`StorageError::StaleGenStamp`] when the replica has another stamp,
    /// [`StorageError::Missing`] when there is none.
    pub fn open_reader(&self, block: u64, gs: u64) -> Result<ReplicaReader, StorageError> {
        // Two tries: a concurrent finalize or reopen may move the files
        // between the lookups of one try.
        for _ in 0..2 {
            let meta = self.open_first(&meta_name(block, gs))?;
            let data = self.open_first(&data_name(block))?;
            if let (Some((meta, meta_path, meta_in)), Some((data, data_path, data_in))) =
                (meta, data)
            {
                let state =
                    if meta_in == ReplicaState::Finalized && data_in == ReplicaState::Finalized {
                        ReplicaState::Finalized
                    } else {
                        ReplicaState::Rbw
                    };
                return Ok(ReplicaReader {
                    block,
                    gs,
                    state,
                    data,
                    meta,
                    data_path,
                    meta_path,
                    io: self.io.clone(),
                });
            }
        }
        Err(self.missing_or_stale(block, gs))
    }

    /// Reads up to `buf.len()` bytes at `offset` of replica `block`@`gs`,
    /// verifying every chunk touched (see [`ReplicaReader::read`]).
    pub fn read(
        &self,
        block: u64,
        gs: u64,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<usize, StorageError> {
        self.open_reader(block, gs)?.read(offset, buf)
    }

    /// The longest prefix of replica `block`@`gs` whose checksums match (see
    /// [`ReplicaReader::valid_prefix`]); lease recovery takes the minimum over
    /// the replicas.
    pub fn valid_prefix(&self, block: u64, gs: u64) -> Result<u64, StorageError> {
        self.open_reader(block, gs)?.valid_prefix()
    }

    /// How much of replica `block`@`gs` survives as a clean prefix: its
    /// valid length when every chunk it holds checks out but perhaps the
    /// last (what a power cut leaves of data that was never synced), `None`
    /// when a chunk before the last one is corrupt (damage, not a lost
    /// tail).
    pub fn clean_prefix(&self, block: u64, gs: u64) -> Result<Option<u64>, StorageError> {
        let r = self.open_reader(block, gs)?;
        let valid = r.valid_prefix()?;
        let present = r.present_len()?;
        Ok((valid + CHUNK_SIZE as u64 >= present).then_some(valid))
    }

    /// Brings a replica whose generation stamp lags the recorded one (the
    /// metadata recorded a bump, truncation or recovery before a crash
    /// kept it from reaching this replica) to the recorded state: cut to
    /// `len`, restamped `gs`, finalized. Retrying after success is a no-op.
    pub fn settle(&self, block: u64, found: u64, gs: u64, len: u64) -> Result<(), StorageError> {
        self.truncate(block, found, gs, len)?;
        self.finalize(block, gs, len)
    }

    /// Removes every file of `block` (any generation stamp, both
    /// directories). Removing an absent block is not an error.
    pub fn delete(&self, block: u64) -> Result<(), StorageError> {
        self.remove_files(block, &self.metas_of(block)?)
    }

    /// Removes the data files of `block` and the meta files `metas` listed.
    fn remove_files(&self, block: u64, metas: &[(u64, ReplicaState)]) -> Result<(), StorageError> {
        for s in ReplicaState::ALL {
            remove_if_exists(&self.data_path(s, block))?;
        }
        for &(gs, s) in metas {
            remove_if_exists(&self.meta_path(s, block, gs))?;
        }
        Ok(())
    }

    /// Deletes the replica of `block` recorded at generation stamp `gs`:
    /// four unlinks at most, where [`Self::delete`] must list both
    /// directories to find the meta file (a cost that grows with the number
    /// of replicas, so deleting many files was quadratic). Falls back to
    /// that when the recorded meta file is not there.
    pub fn delete_recorded(&self, block: u64, gs: u64) -> Result<(), StorageError> {
        let mut found = false;
        for s in ReplicaState::ALL {
            found |= remove_found(&self.meta_path(s, block, gs))?;
        }
        if !found {
            return self.delete(block);
        }
        for s in ReplicaState::ALL {
            remove_if_exists(&self.data_path(s, block))?;
        }
        Ok(())
    }

    /// Every replica on this datanode (both files present), by block id.
    /// Files of unknown names are ignored.
    pub fn list(&self) -> Result<Vec<ReplicaInfo>, StorageError> {
        let mut blocks: BTreeMap<u64, Found> = BTreeMap::new();
        for s in ReplicaState::ALL {
            let dir = self.dir(s);
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
                        blocks.entry(block).or_default().metas.push((gs, s));
                    }
                }
            }
        }
        Ok(blocks
            .iter()
            .filter_map(|(&block, found)| self.pick(block, found))
            .collect())
    }

    /// Copies the first `len` bytes of replica `block`@`gs` from `src`
    /// (verified while read) with their checksums into `tmp/`, makes the
    /// copy durable, removes any other files of the block here, and renames
    /// the copy into `rbw/` or `finalized/` as `state` says.
    pub fn copy_replica_from(
        &self,
        src: &Datanode,
        block: u64,
        gs: u64,
        len: u64,
        state: ReplicaState,
    ) -> Result<(), StorageError> {
        let reader = src.open_reader(block, gs)?;
        let seq = TMP_SEQ.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let tmp_data = self.tmp.join(format!("blk_{block}.{pid}.{seq}.data"));
        let tmp_meta = self.tmp.join(format!("blk_{block}.{pid}.{seq}.meta"));
        let result = self.copy_into_tmp(&reader, len, &tmp_data, &tmp_meta);
        let result = result.and_then(|()| {
            self.replace_older(block, gs)?;
            rename(&tmp_data, &self.data_path(state, block))?;
            rename(&tmp_meta, &self.meta_path(state, block, gs))?;
            fsync_dir(self.dir(state))
        });
        if result.is_err() {
            let _ = fs::remove_file(&tmp_data);
            let _ = fs::remove_file(&tmp_meta);
        }
        result
    }

    /// Clears the way for a copy of `block`@`gs`: every file of the block
    /// goes, which is right for stale leftovers and wrong for the live
    /// replica of a writer that reopened the block (at a newer stamp) after
    /// the copy was planned: replacing that would lose what it fsynced.
    /// One listing serves the check and the removal.
    fn replace_older(&self, block: u64, gs: u64) -> Result<(), StorageError> {
        let metas = self.metas_of(block)?;
        if let Some(found) = metas.iter().map(|(g, _)| *g).max().filter(|f| *f > gs) {
            return Err(StorageError::NewerReplica {
                block,
                found,
                copying: gs,
            });
        }
        self.remove_files(block, &metas)
    }

    fn copy_into_tmp(
        &self,
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

    /// Where replica `block`@`gs` is and how long its data is, from a few
    /// `stat`s (no directory scan unless it is missing or stale, which the
    /// error then says).
    pub fn stat_replica(&self, block: u64, gs: u64) -> Result<(ReplicaState, u64), StorageError> {
        let loc = self.locate(block, gs)?;
        let state =
            if loc.data_in == ReplicaState::Finalized && loc.meta_in == ReplicaState::Finalized {
                ReplicaState::Finalized
            } else {
                ReplicaState::Rbw
            };
        let len = stat_len(&self.data_path(loc.data_in, block))?;
        Ok((state, len))
    }

    /// Removes everything left in `tmp/` (copies interrupted by a crash).
    /// Call when no copy is running, e.g. at mount. Returns how many files
    /// were removed.
    pub fn clean_tmp(&self) -> Result<usize, StorageError> {
        let entries = fs::read_dir(&self.tmp).map_err(|e| StorageError::io(&self.tmp, e))?;
        let mut n = 0;
        for entry in entries {
            let entry = entry.map_err(|e| StorageError::io(&self.tmp, e))?;
            remove_if_exists(&entry.path())?;
            n += 1;
        }
        Ok(n)
    }

    /// Both files of replica `block`@`gs`, or why not.
    fn locate(&self, block: u64, gs: u64) -> Result<Located, StorageError> {
        for _ in 0..2 {
            let data_in = self.first_existing(&data_name(block))?;
            let meta_in = self.first_existing(&meta_name(block, gs))?;
            if let (Some(data_in), Some(meta_in)) = (data_in, meta_in) {
                return Ok(Located { data_in, meta_in });
            }
        }
        Err(self.missing_or_stale(block, gs))
    }

    fn first_existing(&self, name: &str) -> Result<Option<ReplicaState>, StorageError> {
        for s in ReplicaState::ALL {
            if exists(&self.dir(s).join(name))? {
                return Ok(Some(s));
            }
        }
        Ok(None)
    }

    fn open_first(
        &self,
        name: &str,
    ) -> Result<Option<(File, PathBuf, ReplicaState)>, StorageError> {
        for s in ReplicaState::ALL {
            let p = self.dir(s).join(name);
            match File::open(&p) {
                Ok(f) => return Ok(Some((f, p, s))),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(StorageError::io(&p, e)),
            }
        }
        Ok(None)
    }

    /// Why replica `block`@`wanted` cannot be found: another generation
    /// stamp, no replica, or an I/O error while looking.
    fn missing_or_stale(&self, block: u64, wanted: u64) -> StorageError {
        match self.lookup(block) {
            Ok(Some(info)) if info.gs != wanted => StorageError::StaleGenStamp {
                block,
                found: info.gs,
                wanted,
            },
            Ok(_) => StorageError::Missing { block, dn: self.id },
            Err(e) => e,
        }
    }

    /// Generation stamps (and directories) of every meta file of `block`.
    fn metas_of(&self, block: u64) -> Result<Vec<(u64, ReplicaState)>, StorageError> {
        let prefix = format!("blk_{block}_");
        let mut metas = Vec::new();
        for s in ReplicaState::ALL {
            let dir = self.dir(s);
            let entries = fs::read_dir(dir).map_err(|e| StorageError::io(dir, e))?;
            for entry in entries {
                let entry = entry.map_err(|e| StorageError::io(dir, e))?;
                let name = entry.file_name();
                let Some(name) = name.to_str() else { continue };
                if !name.starts_with(&prefix) {
                    continue;
                }
                if let Some(FileName::Meta { block: b, gs }) = parse_name(name)
                    && b == block
                {
                    metas.push((gs, s));
                }
            }
        }
        Ok(metas)
    }

    /// The replica made of the files found: data from `rbw/` before
    /// `finalized/`, the highest generation stamp (in the data's directory
    /// on a tie).
    fn pick(&self, block: u64, found: &Found) -> Option<ReplicaInfo> {
        let (data_in, data_len) = ReplicaState::ALL
            .into_iter()
            .find_map(|s| found.data[s.idx()].map(|len| (s, len)))?;
        let &(gs, meta_in) = found
            .metas
            .iter()
            .max_by_key(|&&(gs, s)| (gs, s == data_in))?;
        let state = if data_in == ReplicaState::Finalized && meta_in == ReplicaState::Finalized {
            ReplicaState::Finalized
        } else {
            ReplicaState::Rbw
        };
        Some(ReplicaInfo {
            block,
            gs,
            state,
            data_len,
            data_path: self.data_path(data_in, block),
            meta_path: self.meta_path(meta_in, block, gs),
        })
    }
}

fn exists(p: &Path) -> Result<bool, StorageError> {
    match fs::symlink_metadata(p) {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(StorageError::io(p, e)),
    }
}

fn stat_len(p: &Path) -> Result<u64, StorageError> {
    fs::metadata(p)
        .map(|m| m.len())
        .map_err(|e| StorageError::io(p, e))
}

fn open_rw(p: &Path) -> Result<File, StorageError> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(p)
        .map_err(|e| StorageError::io(p, e))
}

fn rename(from: &Path, to: &Path) -> Result<(), StorageError> {
    fs::rename(from, to).map_err(|e| StorageError::io(from, e))
}

fn remove_if_exists(p: &Path) -> Result<(), StorageError> {
    remove_found(p).map(drop)
}

/// Removes `p` if it exists; says whether it did.
fn remove_found(p: &Path) -> Result<bool, StorageError> {
    match fs::remove_file(p) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(StorageError::io(p, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::checksum::{ChunkAccumulator, crc};

    fn stream(n: usize, seed: u8) -> Vec<u8> {
        (0..n)
            .map(|i| (i as u8).wrapping_mul(37).wrapping_add(seed) ^ (i >> 8) as u8)
            .collect()
    }

    fn dn(dir: &tempfile::TempDir, index: u32) -> Datanode {
        Datanode::open(DnId(index), &dir.path().join(format!("dn{index}")), None).unwrap()
    }

    /// Writes `data` to a new rbw replica in packets of the given sizes,
    /// syncing after each (as a flush would).
    fn write_in_packets(dn: &Datanode, block: u64, gs: u64, data: &[u8], sizes: &[usize]) {
        let mut w = dn.create_rbw(block, gs).unwrap();
        let mut acc = ChunkAccumulator::new();
        append(&mut w, &mut acc, data, sizes);
    }

    fn append(w: &mut ReplicaWriter, acc: &mut ChunkAccumulator, data: &[u8], sizes: &[usize]) {
        let mut crcs = Vec::new();
        let mut i = 0;
        for &n in sizes.iter().cycle() {
            if i >= data.len() {
                break;
            }
            let n = n.min(data.len() - i);
            let off = w.len();
            crcs.clear();
            acc.crcs_for(off, &data[i..i + n], &mut crcs);
            w.write_packet(off, &data[i..i + n], &crcs).unwrap();
            w.sync().unwrap();
            i += n;
        }
    }

    fn read_all(dn: &Datanode, block: u64, gs: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len + 100];
        let n = dn.read(block, gs, 0, &mut buf).unwrap();
        buf.truncate(n);
        buf
    }

    fn flip_byte(path: &Path, at: u64) {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .unwrap();
        let mut b = [0u8];
        f.read_exact_at(&mut b, at).unwrap();
        f.write_all_at(&[b[0] ^ 0x40], at).unwrap();
    }

    #[test]
    fn write_packets_mid_chunk_after_partial_flush_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let dn = dn(&dir, 0);
        let data = stream(5000, 1);
        write_in_packets(&dn, 7, 1, &data, &[100, 300, 700, 1, 511, 2000, 64]);
        assert_eq!(read_all(&dn, 7, 1, 5000), data);
        // Unaligned ranges, crossing chunk boundaries, and past the end.
        for (off, len) in [
            (0, 1),
            (1, 511),
            (100, 1000),
            (511, 2),
            (1024, 512),
            (4999, 10),
            (3000, 4000),
        ] {
            let mut buf = vec![0u8; len];
            let n = dn.read(7, 1, off as u64, &mut buf).unwrap();
            let want = &data[off.min(5000)..(off + len).min(5000)];
            assert_eq!(&buf[..n], want, "read at {off} len {len}");
        }
        let mut buf = [0u8; 10];
        assert_eq!(dn.read(7, 1, 6000, &mut buf).unwrap(), 0);
        assert_eq!(dn.valid_prefix(7, 1).unwrap(), 5000);
        let meta = dn.dir(ReplicaState::Rbw).join(meta_name(7, 1));
        assert_eq!(fs::metadata(meta).unwrap().len(), meta_len_for(5000));
    }

    #[test]
    fn write_packet_rejects_gaps_and_wrong_crc_count() {
        let dir = tempfile::tempdir().unwrap();
        let dn = dn(&dir, 0);
        let mut w = dn.create_rbw(1, 1).unwrap();
        let data = stream(600, 2);
        let err = w.write_packet(10, &data, &[0, 0]).unwrap_err();
        assert!(matches!(err, StorageError::BadPacket { .. }), "{err}");
        let err = w.write_packet(0, &data, &[0]).unwrap_err();
        assert!(matches!(err, StorageError::BadPacket { .. }), "{err}");
        assert_eq!(w.len(), 0);
        w.write_packet(0, &data, &[crc(&data[..512]), crc(&data[512..])])
            .unwrap();
        assert_eq!(w.len(), 600);
    }

    #[test]
    fn reader_racing_writer_sees_no_false_corruption() {
        // The writer publishes a visible length after each packet (as acks
        // do); a reader reading up to it while the next packet's data is
        // already on disk but its checksums are not must never see Corrupt.
        use crate::sync::{Arc, AtomicBool, AtomicU64, Ordering};
        let dir = tempfile::tempdir().unwrap();
        let dn = Arc::new(dn(&dir, 0));
        let data = Arc::new(stream(200_000, 3));
        let visible = Arc::new(AtomicU64::new(0));
        let done = Arc::new(AtomicBool::new(false));
        let started = Arc::new(AtomicBool::new(false));
        let mut w = dn.create_rbw(1, 1).unwrap();
        let reader = {
            let (dn, data, visible) = (dn.clone(), data.clone(), visible.clone());
            let (done, started) = (done.clone(), started.clone());
            std::thread::spawn(move || {
                started.store(true, Ordering::Release);
                let mut buf = vec![0u8; 4096];
                let mut reads = 0u64;
                while !done.load(Ordering::Acquire) {
                    let v = visible.load(Ordering::Acquire) as usize;
                    let off = v.saturating_sub(700 + reads as usize % 1500);
                    let len = (v - off).min(buf.len());
                    let n = dn.read(1, 1, off as u64, &mut buf[..len]).unwrap();
                    assert_eq!(n, len, "short read at {off} (visible {v})");
                    assert_eq!(&buf[..n], &data[off..off + n]);
                    reads += 1;
                }
                reads
            })
        };
        while !started.load(Ordering::Acquire) {
            std::thread::yield_now();
        }
        let mut acc = ChunkAccumulator::new();
        let mut crcs = Vec::new();
        let mut off = 0;
        for size in [1, 100, 333, 511, 700, 1024, 77].iter().cycle() {
            let n = (*size).min(data.len() - off);
            if n == 0 {
                break;
            }
            crcs.clear();
            acc.crcs_for(off as u64, &data[off..off + n], &mut crcs);
            w.write_packet(off as u64, &data[off..off + n], &crcs)
                .unwrap();
            off += n;
            visible.store(off as u64, Ordering::Release);
            std::thread::yield_now();
        }
        done.store(true, Ordering::Release);
        assert!(reader.join().unwrap() > 0);
    }

    #[test]
    fn reader_of_finalized_replica_survives_append() {
        // `tail -f` while `>>` appends: a reader opened on the finalized
        // replica sees the data grow before its checksums.
        let dir = tempfile::tempdir().unwrap();
        let dn = dn(&dir, 0);
        let data = stream(1000, 14);
        write_in_packets(&dn, 5, 1, &data[..300], &[300]);
        dn.finalize(5, 1, 300).unwrap();
        let reader = dn.open_reader(5, 1).unwrap();
        assert_eq!(reader.state(), ReplicaState::Finalized);
        let w = dn.reopen_rbw(5, 1, 300).unwrap();
        // The writer's data is on disk, its checksums not yet.
        OpenOptions::new()
            .write(true)
            .open(w.path())
            .unwrap()
            .write_all_at(&data[300..], 300)
            .unwrap();
        let mut buf = vec![0u8; 1000];
        assert_eq!(reader.read(0, &mut buf).unwrap(), 300);
        assert_eq!(&buf[..300], &data[..300]);
    }

    #[test]
    fn finalized_replica_with_short_meta_is_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let dn = dn(&dir, 0);
        write_in_packets(&dn, 5, 1, &stream(2000, 15), &[2000]);
        dn.finalize(5, 1, 2000).unwrap();
        let meta = dn.meta_path(ReplicaState::Finalized, 5, 1);
        OpenOptions::new()
            .write(true)
            .open(&meta)
            .unwrap()
            .set_len(meta_len_for(1024))
            .unwrap();
        let mut buf = vec![0u8; 2000];
        assert!(matches!(
            dn.read(5, 1, 0, &mut buf),
            Err(StorageError::Corrupt { offset: 1024, .. })
        ));
        assert_eq!(dn.read(5, 1, 0, &mut buf[..1024]).unwrap(), 1024);
        assert_eq!(dn.valid_prefix(5, 1).unwrap(), 1024);
    }

    #[test]
    fn corrupt_byte_read_gives_corrupt_and_valid_prefix_stops_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let dn = dn(&dir, 3);
        let data = stream(3000, 4);
        write_in_packets(&dn, 9, 5, &data, &[1000]);
        dn.finalize(9, 5, 3000).unwrap();
        let path = dn.data_path(ReplicaState::Finalized, 9);
        flip_byte(&path, 1500);
        let mut buf = vec![0u8; 100];
        // A read of a byte anywhere in the bad chunk fails...
        match dn.read(9, 5, 1030, &mut buf).unwrap_err() {
            StorageError::Corrupt {
                block,
                replica,
                offset,
            } => {
                assert_eq!((block, offset), (9, 1024));
                assert_eq!(replica, path);
            }
            e => panic!("expected Corrupt, got {e}"),
        }
        // ...reads of other chunks do not.
        assert_eq!(dn.read(9, 5, 0, &mut buf[..]).unwrap(), 100);
        assert_eq!(dn.read(9, 5, 1536, &mut buf[..]).unwrap(), 100);
        assert_eq!(dn.valid_prefix(9, 5).unwrap(), 1024);
        assert_eq!(
            StorageError::Corrupt {
                block: 9,
                replica: path,
                offset: 1024
            }
            .errno(),
            libc::EIO
        );
    }

    #[test]
    fn truncated_data_file_valid_prefix() {
        let dir = tempfile::tempdir().unwrap();
        let dn = dn(&dir, 0);
        let data = stream(3000, 5);
        write_in_packets(&dn, 4, 1, &data, &[3000]);
        let path = dn.data_path(ReplicaState::Rbw, 4);
        let f = OpenOptions::new().write(true).open(&path).unwrap();
        // Cut mid-chunk: that chunk's CRC covers bytes that are gone.
        f.set_len(1300).unwrap();
        assert_eq!(dn.valid_prefix(4, 1).unwrap(), 1024);
        // Cut at a chunk boundary: every remaining chunk is whole.
        f.set_len(1024).unwrap();
        assert_eq!(dn.valid_prefix(4, 1).unwrap(), 1024);
        f.set_len(0).unwrap();
        assert_eq!(dn.valid_prefix(4, 1).unwrap(), 0);
    }

    #[test]
    fn crash_between_data_and_meta_write_keeps_covered_bytes() {
        // The writer writes data, then checksums; a crash in between leaves
        // data no checksum covers. The covered bytes stay valid and
        // readable, the rest is never served.
        let dir = tempfile::tempdir().unwrap();
        let dn = dn(&dir, 0);
        let data = stream(300, 6);
        write_in_packets(&dn, 2, 1, &data, &[300]);
        let path = dn.data_path(ReplicaState::Rbw, 2);
        let f = OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all_at(&stream(900, 9), 300).unwrap();
        assert_eq!(dn.valid_prefix(2, 1).unwrap(), 300);
        assert_eq!(read_all(&dn, 2, 1, 1200), data);
        let mut buf = [0u8; 50];
        assert_eq!(dn.read(2, 1, 100, &mut buf).unwrap(), 50);
        assert_eq!(&buf[..], &data[100..150]);
        // Recovery cuts the replica to the valid prefix.
        dn.truncate(2, 1, 2, 300).unwrap();
        assert_eq!(dn.find(2).unwrap().data_len, 300);
        assert_eq!(dn.valid_prefix(2, 2).unwrap(), 300);
    }

    #[test]
    fn finalize_moves_files_and_cuts_longer_data() {
        let dir = tempfile::tempdir().unwrap();
        let dn = dn(&dir, 0);
        let data = stream(1200, 7);
        write_in_packets(&dn, 5, 3, &data, &[1200]);
        assert_eq!(dn.find(5).unwrap().state, ReplicaState::Rbw);
        dn.finalize(5, 3, 1000).unwrap();
        assert!(!dn.data_path(ReplicaState::Rbw, 5).exists());
        assert!(!dn.meta_path(ReplicaState::Rbw, 5, 3).exists());
        let info = dn.find(5).unwrap();
        assert_eq!(info.state, ReplicaState::Finalized);
        assert_eq!((info.gs, info.data_len), (3, 1000));
        assert_eq!(info.data_path, dn.data_path(ReplicaState::Finalized, 5));
        assert_eq!(info.meta_path, dn.meta_path(ReplicaState::Finalized, 5, 3));
        assert_eq!(
            fs::metadata(&info.meta_path).unwrap().len(),
            meta_len_for(1000)
        );
        assert_eq!(read_all(&dn, 5, 3, 1200), &data[..1000]);
        assert_eq!(dn.valid_prefix(5, 3).unwrap(), 1000);
        // Idempotent; longer than the data is refused.
        dn.finalize(5, 3, 1000).unwrap();
        assert!(matches!(
            dn.finalize(5, 3, 2000),
            Err(StorageError::TooShort {
                len: 1000,
                wanted: 2000,
                ..
            })
        ));
    }

    #[test]
    fn finalize_completes_after_crash_between_renames() {
        let dir = tempfile::tempdir().unwrap();
        let dn = dn(&dir, 0);
        let data = stream(700, 8);
        write_in_packets(&dn, 6, 1, &data, &[700]);
        // Data moved, meta not yet.
        fs::rename(
            dn.data_path(ReplicaState::Rbw, 6),
            dn.data_path(ReplicaState::Finalized, 6),
        )
        .unwrap();
        let info = dn.find(6).unwrap();
        assert_eq!(
            (info.state, info.gs, info.data_len),
            (ReplicaState::Rbw, 1, 700)
        );
        assert_eq!(read_all(&dn, 6, 1, 700), data);
        dn.finalize(6, 1, 700).unwrap();
        assert_eq!(dn.find(6).unwrap().state, ReplicaState::Finalized);
    }

    #[test]
    fn bump_gs_renames_meta_and_old_gs_is_stale() {
        let dir = tempfile::tempdir().unwrap();
        let dn = dn(&dir, 2);
        let data = stream(800, 9);
        let mut w = dn.create_rbw(8, 1).unwrap();
        let mut acc = ChunkAccumulator::new();
        append(&mut w, &mut acc, &data[..300], &[300]);
        dn.bump_gs(8, 1, 2).unwrap();
        // The open writer keeps writing through its descriptors.
        append(&mut w, &mut acc, &data[300..], &[500]);
        assert!(!dn.meta_path(ReplicaState::Rbw, 8, 1).exists());
        assert_eq!(dn.find(8).unwrap().gs, 2);
        let mut buf = [0u8; 10];
        assert!(matches!(
            dn.read(8, 1, 0, &mut buf),
            Err(StorageError::StaleGenStamp {
                block: 8,
                found: 2,
                wanted: 1
            })
        ));
        assert!(matches!(
            dn.valid_prefix(8, 1),
            Err(StorageError::StaleGenStamp {
                found: 2,
                wanted: 1,
                ..
            })
        ));
        assert_eq!(read_all(&dn, 8, 2, 800), data);
        // A retried bump is a no-op; a block that is not here is Missing.
        dn.bump_gs(8, 1, 2).unwrap();
        assert!(matches!(
            dn.read(99, 1, 0, &mut buf),
            Err(StorageError::Missing {
                block: 99,
                dn: DnId(2)
            })
        ));
        assert!(matches!(
            dn.bump_gs(99, 1, 2),
            Err(StorageError::Missing { .. })
        ));
    }

    #[test]
    fn truncate_shrink_recomputes_last_chunk_crc() {
        let dir = tempfile::tempdir().unwrap();
        let dn = dn(&dir, 0);
        let data = stream(2000, 10);
        write_in_packets(&dn, 3, 4, &data, &[2000]);
        dn.finalize(3, 4, 2000).unwrap();
        dn.truncate(3, 4, 5, 700).unwrap();
        let info = dn.find(3).unwrap();
        assert_eq!(
            (info.gs, info.data_len, info.state),
            (5, 700, ReplicaState::Finalized)
        );
        assert_eq!(
            fs::metadata(&info.meta_path).unwrap().len(),
            meta_len_for(700)
        );
        assert_eq!(read_all(&dn, 3, 5, 2000), &data[..700]);
        assert_eq!(dn.valid_prefix(3, 5).unwrap(), 700);
        // Retrying is a no-op; growing is refused; a chunk boundary works.
        dn.truncate(3, 4, 5, 700).unwrap();
        assert!(matches!(
            dn.truncate(3, 5, 6, 701),
            Err(StorageError::TooShort { .. })
        ));
        dn.truncate(3, 5, 6, 512).unwrap();
        assert_eq!(read_all(&dn, 3, 6, 700), &data[..512]);
    }

    #[test]
    fn truncate_refuses_to_bless_a_corrupt_last_chunk() {
        let dir = tempfile::tempdir().unwrap();
        let dn = dn(&dir, 0);
        write_in_packets(&dn, 3, 1, &stream(1000, 11), &[1000]);
        flip_byte(&dn.data_path(ReplicaState::Rbw, 3), 600);
        assert!(matches!(
            dn.truncate(3, 1, 2, 700),
            Err(StorageError::Corrupt { offset: 512, .. })
        ));
    }

    #[test]
    fn reopen_rbw_continues_appending() {
        let dir = tempfile::tempdir().unwrap();
        let dn = dn(&dir, 0);
        let data = stream(3000, 12);
        write_in_packets(&dn, 11, 1, &data[..700], &[700]);
        dn.finalize(11, 1, 700).unwrap();
        dn.bump_gs(11, 1, 2).unwrap();
        // A replica that cannot be reopened stays where it was.
        assert!(matches!(
            dn.reopen_rbw(11, 2, 701),
            Err(StorageError::TooShort { .. })
        ));
        assert_eq!(dn.find(11).unwrap().state, ReplicaState::Finalized);
        // Append: the finalized replica goes back to rbw.
        let mut w = dn.reopen_rbw(11, 2, 700).unwrap();
        assert_eq!(w.len(), 700);
        assert_eq!(dn.find(11).unwrap().state, ReplicaState::Rbw);
        let tail = w.take_resume_tail();
        assert_eq!(tail, &data[512..700]);
        let mut acc = ChunkAccumulator::resume(tail);
        append(&mut w, &mut acc, &data[700..2000], &[100, 900]);
        // Pipeline recovery: reopen an rbw replica at a shorter length.
        drop(w);
        let mut w = dn.reopen_rbw(11, 2, 1800).unwrap();
        let mut acc = ChunkAccumulator::resume(w.take_resume_tail());
        append(&mut w, &mut acc, &data[1800..], &[333]);
        dn.finalize(11, 2, 3000).unwrap();
        assert_eq!(read_all(&dn, 11, 2, 3000), data);
        assert_eq!(dn.valid_prefix(11, 2).unwrap(), 3000);
    }

    #[test]
    fn copy_replica_from_copies_prefix_and_replaces_stale_replica() {
        let dir = tempfile::tempdir().unwrap();
        let src = dn(&dir, 0);
        let dst = dn(&dir, 1);
        let data = stream(1300, 13);
        write_in_packets(&src, 12, 3, &data, &[1300]);
        // A stale replica of the same block on the destination.
        write_in_packets(&dst, 12, 1, &stream(50, 0), &[50]);
        dst.copy_replica_from(&src, 12, 3, 1000, ReplicaState::Finalized)
            .unwrap();
        let info = dst.find(12).unwrap();
        assert_eq!(
            (info.gs, info.data_len, info.state),
            (3, 1000, ReplicaState::Finalized)
        );
        assert!(!dst.meta_path(ReplicaState::Rbw, 12, 1).exists());
        assert!(!dst.data_path(ReplicaState::Rbw, 12).exists());
        assert_eq!(read_all(&dst, 12, 3, 1300), &data[..1000]);
        assert_eq!(dst.valid_prefix(12, 3).unwrap(), 1000);
        assert_eq!(fs::read_dir(dst.root.join("tmp")).unwrap().count(), 0);
        // Too long a copy, or a corrupt source, fails and leaves no temp files.
        assert!(matches!(
            dst.copy_replica_from(&src, 12, 3, 2000, ReplicaState::Rbw),
            Err(StorageError::TooShort {
                len: 1300,
                wanted: 2000,
                ..
            })
        ));
        flip_byte(&src.data_path(ReplicaState::Rbw, 12), 10);
        assert!(matches!(
            dst.copy_replica_from(&src, 12, 3, 1000, ReplicaState::Rbw),
            Err(StorageError::Corrupt { offset: 0, .. })
        ));
        assert_eq!(fs::read_dir(dst.root.join("tmp")).unwrap().count(), 0);
        assert_eq!(read_all(&dst, 12, 3, 1300), &data[..1000]);
    }

    #[test]
    fn copy_replica_from_never_replaces_a_newer_replica() {
        let dir = tempfile::tempdir().unwrap();
        let src = dn(&dir, 0);
        let dst = dn(&dir, 1);
        write_in_packets(&src, 12, 3, &stream(1000, 13), &[1000]);
        src.finalize(12, 3, 1000).unwrap();
        // A writer reopened the block on the destination at stamp 4.
        let live = stream(1500, 7);
        write_in_packets(&dst, 12, 4, &live, &[1500]);
        assert!(matches!(
            dst.copy_replica_from(&src, 12, 3, 1000, ReplicaState::Finalized),
            Err(StorageError::NewerReplica {
                found: 4,
                copying: 3,
                ..
            })
        ));
        assert_eq!(read_all(&dst, 12, 4, 1500), live);
        assert_eq!(fs::read_dir(dst.root.join("tmp")).unwrap().count(), 0);
    }

    #[test]
    fn list_reports_every_complete_replica() {
        let dir = tempfile::tempdir().unwrap();
        let dn = dn(&dir, 0);
        write_in_packets(&dn, 30, 1, &stream(10, 1), &[10]);
        write_in_packets(&dn, 20, 2, &stream(600, 1), &[600]);
        dn.finalize(20, 2, 600).unwrap();
        write_in_packets(&dn, 10, 5, &stream(0, 1), &[1]);
        // Junk and half replicas are not listed.
        fs::write(dn.dir(ReplicaState::Rbw).join("notes.txt"), b"x").unwrap();
        fs::write(dn.dir(ReplicaState::Rbw).join("blk_40"), b"x").unwrap();
        fs::write(dn.dir(ReplicaState::Finalized).join(meta_name(50, 1)), b"x").unwrap();
        let got: Vec<_> = dn
            .list()
            .unwrap()
            .into_iter()
            .map(|r| (r.block, r.gs, r.state, r.data_len))
            .collect();
        assert_eq!(
            got,
            vec![
                (10, 5, ReplicaState::Rbw, 0),
                (20, 2, ReplicaState::Finalized, 600),
                (30, 1, ReplicaState::Rbw, 10),
            ]
        );
        dn.delete(20).unwrap();
        dn.delete(20).unwrap();
        assert!(dn.find(20).is_none());
        assert_eq!(dn.list().unwrap().len(), 2);
    }

    #[test]
    fn delete_recorded_removes_both_files_and_falls_back_on_another_gs() {
        let dir = tempfile::tempdir().unwrap();
        let dn = dn(&dir, 0);
        write_in_packets(&dn, 7, 3, &stream(700, 1), &[700]);
        dn.finalize(7, 3, 700).unwrap();
        write_in_packets(&dn, 8, 4, &stream(100, 2), &[100]);
        dn.delete_recorded(7, 3).unwrap();
        assert!(dn.find(7).is_none());
        // Recorded at an older stamp than the meta file's: found by listing.
        dn.delete_recorded(8, 2).unwrap();
        assert!(dn.find(8).is_none());
        assert!(dn.list().unwrap().is_empty());
        for s in ReplicaState::ALL {
            assert_eq!(fs::read_dir(dn.dir(s)).unwrap().count(), 0);
        }
    }

    #[test]
    fn finalize_written_moves_an_exact_replica_and_checks_any_other() {
        let dir = tempfile::tempdir().unwrap();
        let dn = dn(&dir, 0);
        let mut w = dn.create_rbw(5, 1).unwrap();
        let mut acc = ChunkAccumulator::new();
        append(&mut w, &mut acc, &stream(1000, 3), &[1000]);
        dn.finalize_written(w, 5, 1, 1000).unwrap();
        let r = dn.find(5).unwrap();
        assert_eq!(
            (r.state, r.data_len, r.gs),
            (ReplicaState::Finalized, 1000, 1)
        );
        // A shorter length than written: cut to it, as `finalize` does.
        let mut w = dn.create_rbw(6, 1).unwrap();
        let mut acc = ChunkAccumulator::new();
        append(&mut w, &mut acc, &stream(1000, 4), &[1000]);
        dn.finalize_written(w, 6, 1, 600).unwrap();
        let r = dn.find(6).unwrap();
        assert_eq!((r.state, r.data_len), (ReplicaState::Finalized, 600));
    }

    #[test]
    fn create_rbw_removes_leftovers() {
        let dir = tempfile::tempdir().unwrap();
        let dn = dn(&dir, 0);
        write_in_packets(&dn, 1, 1, &stream(900, 1), &[900]);
        let data = stream(100, 2);
        write_in_packets(&dn, 1, 2, &data, &[100]);
        assert!(!dn.meta_path(ReplicaState::Rbw, 1, 1).exists());
        assert_eq!(read_all(&dn, 1, 2, 900), data);
        dn.finalize(1, 2, 100).unwrap();
        write_in_packets(&dn, 1, 3, &data[..10], &[10]);
        assert_eq!(dn.list().unwrap().len(), 1);
        assert_eq!(read_all(&dn, 1, 3, 900), &data[..10]);
    }

    #[test]
    fn bad_meta_header_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let dn = dn(&dir, 0);
        write_in_packets(&dn, 1, 1, &stream(900, 1), &[900]);
        flip_byte(&dn.meta_path(ReplicaState::Rbw, 1, 1), 0);
        let mut buf = [0u8; 10];
        assert!(matches!(
            dn.read(1, 1, 0, &mut buf),
            Err(StorageError::BadMeta { .. })
        ));
        assert!(matches!(
            dn.valid_prefix(1, 1),
            Err(StorageError::BadMeta { .. })
        ));
    }

    #[test]
    fn enospc_and_edquot_map_to_no_space() {
        let p = Path::new("/dn/rbw/blk_1");
        for errno in [libc::ENOSPC, libc::EDQUOT] {
            let e = StorageError::io(p, io::Error::from_raw_os_error(errno));
            assert!(
                matches!(&e, StorageError::NoSpace { path } if path == p),
                "{e:?}"
            );
            assert_eq!(e.errno(), libc::ENOSPC);
            assert!(e.to_string().contains("/dn/rbw/blk_1"), "{e}");
        }
        let e = StorageError::io(p, io::Error::from_raw_os_error(libc::EROFS));
        assert!(matches!(e, StorageError::Io { .. }));
        assert_eq!(e.errno(), libc::EIO);
        assert!(e.to_string().contains("/dn/rbw/blk_1"), "{e}");
    }

    #[test]
    fn parse_name_accepts_only_replica_files() {
        assert_eq!(parse_name("blk_12"), Some(FileName::Data(12)));
        assert_eq!(
            parse_name("blk_12_7.meta"),
            Some(FileName::Meta { block: 12, gs: 7 })
        );
        for bad in [
            "blk_",
            "blk_+1",
            "blk_1_.meta",
            "blk_a",
            "blk_1_2_3.meta",
            "x_1",
            "blk_1.tmp",
        ] {
            assert_eq!(parse_name(bad), None, "{bad}");
        }
    }
}
