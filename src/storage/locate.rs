//! Finding the files of one block in a datanode directory, and removing
//! them. A replica of a known generation stamp costs a few `stat`s (its
//! two names are known); any other question (which stamp is there, is it
//! missing or stale) scans both directories for the block's meta files.

use std::fs::File;

use super::at::At;
use super::error::StorageError;
use super::layout::{
    FileName, Found, Layout, Located, MetaFile, ReplicaInfo, ReplicaStat, ReplicaState, data_name,
    meta_name, parse_name,
};

/// The replica of `block`, if both of its files exist: the data file in
/// `rbw/`, else in `finalized/`; the meta file with the highest generation
/// stamp. Scans both directories for meta files, so it costs time
/// proportional to the number of replicas.
pub(crate) fn lookup(l: &Layout, block: u64) -> Result<Option<ReplicaInfo>, StorageError> {
    let mut found = Found::default();
    for s in ReplicaState::ALL {
        if let Some(st) = l.data(s, block).lstat()? {
            found.data[s.idx()] = Some(st.st_size as u64);
        }
    }
    found.metas = metas_of(l, block)?;
    Ok(found.pick(l, block))
}

/// Both files of replica `block`@`gs`, or why not.
pub(crate) fn locate(l: &Layout, block: u64, gs: u64) -> Result<Located, StorageError> {
    // Two tries: a concurrent finalize or reopen may move the files
    // between the lookups of one try.
    for _ in 0..2 {
        let data_in = first_existing(l, &data_name(block))?;
        let meta_in = first_existing(l, &meta_name(block, gs))?;
        if let (Some(data_in), Some(meta_in)) = (data_in, meta_in) {
            return Ok(Located { data_in, meta_in });
        }
    }
    Err(missing_or_stale(l, block, gs))
}

/// Where replica `block`@`gs` is and how long its data is, from a few
/// `stat`s (no directory scan unless it is missing or stale, which the
/// error then says).
pub(crate) fn stat_replica(l: &Layout, block: u64, gs: u64) -> Result<ReplicaStat, StorageError> {
    let loc = locate(l, block, gs)?;
    Ok(ReplicaStat {
        state: loc.state(),
        data_len: l.data(loc.data_in, block).stat_len()?,
    })
}

fn first_existing(l: &Layout, name: &str) -> Result<Option<ReplicaState>, StorageError> {
    for s in ReplicaState::ALL {
        if l.at(s.into(), name.to_string()).exists()? {
            return Ok(Some(s));
        }
    }
    Ok(None)
}

/// A file opened where [`open_first`] found it.
pub(crate) struct Opened {
    pub file: File,
    pub at: At,
    pub dir: ReplicaState,
}

/// Opens `name` for reading from `rbw/`, else from `finalized/`.
pub(crate) fn open_first(l: &Layout, name: &str) -> Result<Option<Opened>, StorageError> {
    for dir in ReplicaState::ALL {
        let at = l.at(dir.into(), name.to_string());
        if let Some(file) = at.open_read_if_exists()? {
            return Ok(Some(Opened { file, at, dir }));
        }
    }
    Ok(None)
}

/// Why replica `block`@`wanted` cannot be found: another generation
/// stamp, no replica, or an I/O error while looking.
pub(crate) fn missing_or_stale(l: &Layout, block: u64, wanted: u64) -> StorageError {
    match lookup(l, block) {
        Ok(Some(info)) if info.gs != wanted => StorageError::StaleGenStamp {
            block,
            found: info.gs,
            wanted,
        },
        Ok(_) => StorageError::Missing { block, dn: l.id },
        Err(e) => e,
    }
}

/// Every meta file of `block`, in both directories.
pub(crate) fn metas_of(l: &Layout, block: u64) -> Result<Vec<MetaFile>, StorageError> {
    let prefix = format!("blk_{block}_");
    let mut metas = Vec::new();
    let fds = l.fds();
    for s in ReplicaState::ALL {
        for name in fds.dir(s.into()).names()? {
            if !name.starts_with(&prefix) {
                continue;
            }
            if let Some(FileName::Meta { block: b, gs }) = parse_name(&name)
                && b == block
            {
                metas.push(MetaFile { gs, dir: s });
            }
        }
    }
    Ok(metas)
}

/// Removes every file of `block` (any generation stamp, both
/// directories). Removing an absent block is not an error.
pub(crate) fn delete(l: &Layout, block: u64) -> Result<(), StorageError> {
    remove_files(l, block, &metas_of(l, block)?)
}

/// Removes the data files of `block`, the meta files `metas` listed and
/// the block's sync note.
pub(crate) fn remove_files(l: &Layout, block: u64, metas: &[MetaFile]) -> Result<(), StorageError> {
    for s in ReplicaState::ALL {
        l.data(s, block).remove_if_exists()?;
    }
    for m in metas {
        l.meta(m.dir, block, m.gs).remove_if_exists()?;
    }
    l.note(block).remove_if_exists()
}
