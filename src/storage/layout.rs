//! The on-disk layout of a datanode directory, as names and paths only (no
//! I/O), so that every other storage module can share it.
//!
//! `DN/VERSION` is the directory's identity (see [`super::identity`]),
//! `DN/rbw/` holds replicas being written, `DN/finalized/` finished ones,
//! `DN/tmp/` copies in progress and heartbeat probes. A replica of block
//! `id` with generation stamp `gs` is the data file `blk_<id>` and the
//! checksum file `blk_<id>_<gs>.meta` (see [`super::checksum`]), both in
//! `rbw/` or both in `finalized/`.
//!
//! A replica whose sync once ended inside a checksum chunk also has a
//! note, `rbw/blk_<id>.last`, whichever directory its files are in (see
//! [`super::note`]).
//!
//! Moving a replica between directories renames the data file, then the
//! meta file. A crash in between leaves them in different directories;
//! lookups find each file on its own (rbw first), and such a replica counts
//! as being written, so recovery finalizes it again.

use std::path::{Path, PathBuf};

use super::at::{At, Dirs, Sub};
use super::error::StorageError;
use crate::sync::{Arc, RwLock};

/// Re-exported: block rows and errors name datanodes by it.
pub use super::dnid::DnId;

/// Where a replica lives: being written (`rbw/`) or finished (`finalized/`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum ReplicaState {
    Rbw,
    Finalized,
}

impl ReplicaState {
    /// Lookup order: a replica being written wins over a finalized one.
    pub(crate) const ALL: [ReplicaState; 2] = [ReplicaState::Rbw, ReplicaState::Finalized];

    /// The directory name under the datanode root.
    pub fn dir_name(self) -> &'static str {
        match self {
            ReplicaState::Rbw => "rbw",
            ReplicaState::Finalized => "finalized",
        }
    }

    pub(crate) fn idx(self) -> usize {
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

/// Where a replica of a known generation stamp is, and how long its data
/// is (a few `stat`s, no directory scan).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplicaStat {
    /// `Finalized` only when both files are in `finalized/`.
    pub state: ReplicaState,
    pub data_len: u64,
}

/// Data file name of a block.
pub fn data_name(block: u64) -> String {
    format!("blk_{block}")
}

/// Meta file name of a block at a generation stamp.
pub fn meta_name(block: u64, gs: u64) -> String {
    format!("blk_{block}_{gs}.meta")
}

/// Sync note file name of a block (in `rbw/`).
fn note_name(block: u64) -> String {
    format!("blk_{block}.last")
}

/// A file name in `rbw/` or `finalized/`.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum FileName {
    Data(u64),
    Meta { block: u64, gs: u64 },
}

/// What a name in `rbw/` or `finalized/` is; `None` for anything that is
/// not a replica file (such files are left alone).
pub(crate) fn parse_name(name: &str) -> Option<FileName> {
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

/// The paths of one datanode directory, its directories held open (every
/// file operation goes through them, see [`super::at`]), and the registry
/// id its replicas are recorded under (which errors and logs name).
#[derive(Debug)]
pub struct Layout {
    pub id: DnId,
    root: PathBuf,
    /// `rbw/` and `finalized/`, indexed by [`ReplicaState::idx`].
    dirs: [PathBuf; 2],
    tmp: PathBuf,
    /// Replaced at each heartbeat by the directories as the path gives
    /// them then, checked again (see `maintenance::heartbeat`).
    fds: RwLock<Arc<Dirs>>,
}

impl From<ReplicaState> for Sub {
    fn from(s: ReplicaState) -> Sub {
        match s {
            ReplicaState::Rbw => Sub::Rbw,
            ReplicaState::Finalized => Sub::Finalized,
        }
    }
}

impl Layout {
    /// Opens the datanode directory `root` (see [`Dirs::open`]).
    /// The root is created (mode 0700) when missing.
    pub fn open(id: DnId, root: &Path) -> Result<Layout, StorageError> {
        super::trust::create_private_dirs(root).map_err(|e| StorageError::io(root, e))?;
        let fds = Dirs::open(root)?;
        Ok(Layout {
            id,
            root: root.to_path_buf(),
            dirs: ReplicaState::ALL.map(|s| root.join(s.dir_name())),
            tmp: root.join("tmp"),
            fds: RwLock::new(Arc::new(fds)),
        })
    }

    /// The directories as held now.
    pub(crate) fn fds(&self) -> Arc<Dirs> {
        self.fds.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Holds `fds` from now on (the directory was recreated).
    pub(crate) fn replace_fds(&self, fds: Dirs) {
        *self.fds.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(fds);
    }

    /// `name` in directory `sub`.
    pub(crate) fn at(&self, sub: Sub, name: String) -> At {
        let dir = match sub {
            Sub::Rbw | Sub::Finalized => &self.dirs[sub as usize],
            Sub::Tmp => &self.tmp,
            Sub::Root => &self.root,
        };
        At {
            dirs: self.fds(),
            sub,
            path: dir.join(&name),
            name,
        }
    }

    /// The data file of `block` in `state`'s directory.
    pub(crate) fn data(&self, state: ReplicaState, block: u64) -> At {
        self.at(state.into(), data_name(block))
    }

    /// The meta file of `block`@`gs` in `state`'s directory.
    pub(crate) fn meta(&self, state: ReplicaState, block: u64, gs: u64) -> At {
        self.at(state.into(), meta_name(block, gs))
    }

    /// The sync note of `block`'s replica (see [`super::note`]).
    pub(crate) fn note(&self, block: u64) -> At {
        self.at(Sub::Rbw, note_name(block))
    }

    /// `fsync` of `state`'s directory.
    pub(crate) fn fsync_dir(&self, state: ReplicaState) -> Result<(), StorageError> {
        self.fds().fsync(state.into())
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The directory of replicas in `state`.
    pub fn dir(&self, state: ReplicaState) -> &Path {
        &self.dirs[state.idx()]
    }

    /// Where copies are assembled and heartbeat probes written.
    pub fn tmp(&self) -> &Path {
        &self.tmp
    }

    /// `rbw/`, `finalized/` and `tmp/`: what a datanode directory holds.
    pub fn subdirs(&self) -> [&Path; 3] {
        [&self.dirs[0], &self.dirs[1], &self.tmp]
    }

    pub fn data_path(&self, state: ReplicaState, block: u64) -> PathBuf {
        self.dir(state).join(data_name(block))
    }

    pub fn meta_path(&self, state: ReplicaState, block: u64, gs: u64) -> PathBuf {
        self.dir(state).join(meta_name(block, gs))
    }

    /// The sync note of `block`'s replica (see [`super::note`]).
    pub fn note_path(&self, block: u64) -> PathBuf {
        self.dir(ReplicaState::Rbw).join(note_name(block))
    }
}

/// A meta file of a block found on disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MetaFile {
    pub gs: u64,
    pub dir: ReplicaState,
}

/// The files of one block found in both directories.
#[derive(Debug, Default)]
pub(crate) struct Found {
    /// Data file length, by directory (rbw, finalized).
    pub data: [Option<u64>; 2],
    pub metas: Vec<MetaFile>,
}

impl Found {
    /// The replica these files make: data from `rbw/` before
    /// `finalized/`, the highest generation stamp (in the data's directory
    /// on a tie); `None` without a data file and a meta file.
    pub fn pick(&self, layout: &Layout, block: u64) -> Option<ReplicaInfo> {
        let (data_in, data_len) = ReplicaState::ALL
            .into_iter()
            .find_map(|s| self.data[s.idx()].map(|len| (s, len)))?;
        let meta = self.metas.iter().max_by_key(|m| (m.gs, m.dir == data_in))?;
        let loc = Located {
            data_in,
            meta_in: meta.dir,
        };
        Some(ReplicaInfo {
            block,
            gs: meta.gs,
            state: loc.state(),
            data_len,
            data_path: layout.data_path(data_in, block),
            meta_path: layout.meta_path(meta.dir, block, meta.gs),
        })
    }
}

/// The directories holding both files of a replica with a known
/// generation stamp.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Located {
    pub data_in: ReplicaState,
    pub meta_in: ReplicaState,
}

impl Located {
    /// `Finalized` only when both files are in `finalized/`: a replica
    /// caught between the renames of a move counts as being written.
    pub fn state(self) -> ReplicaState {
        if self.data_in == ReplicaState::Finalized && self.meta_in == ReplicaState::Finalized {
            ReplicaState::Finalized
        } else {
            ReplicaState::Rbw
        }
    }

    /// Either file is in `finalized/`.
    pub fn any_finalized(self) -> bool {
        self.data_in == ReplicaState::Finalized || self.meta_in == ReplicaState::Finalized
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn pick_prefers_rbw_data_and_the_highest_stamp() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("dn");
        let l = Layout::open(DnId(1), &root).unwrap();
        let meta = |gs, dir| MetaFile { gs, dir };
        let f = Found {
            data: [Some(10), Some(20)],
            metas: vec![
                meta(3, ReplicaState::Finalized),
                meta(5, ReplicaState::Rbw),
                meta(5, ReplicaState::Finalized),
            ],
        };
        let r = f.pick(&l, 7).unwrap();
        assert_eq!((r.gs, r.data_len, r.state), (5, 10, ReplicaState::Rbw));
        assert_eq!(r.data_path, root.join("rbw/blk_7"));
        assert_eq!(r.meta_path, root.join("rbw/blk_7_5.meta"));
        // Both files finalized: a finalized replica; half a replica: none.
        let f = Found {
            data: [None, Some(20)],
            metas: vec![meta(2, ReplicaState::Finalized)],
        };
        assert_eq!(f.pick(&l, 7).unwrap().state, ReplicaState::Finalized);
        let f = Found {
            data: [None, Some(20)],
            metas: vec![],
        };
        assert!(f.pick(&l, 7).is_none());
    }
}
