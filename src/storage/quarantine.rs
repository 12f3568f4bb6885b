//! The quarantine: where replicas the metadata does not know go instead of
//! being deleted. An unknown replica is a guess (a `meta.db` restored from
//! a backup, or a copy of the data directory pointed at the same
//! datanodes, makes every newer replica look unknown), and a guess never
//! earns an irreversible delete: the files move, by rename, to
//! `DN/quarantine/<unix seconds>-blk_<id>/`, where an operator can look at
//! them (`fsck` lists them) until housekeeping removes them after
//! [`RETENTION`]. A replica about to be cut shorter than it is on a guess
//! (adopting a stamp the metadata never recorded) is copied there first.

use std::fs;
use std::io;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::error::StorageError;
use super::fsops::{exists, fsync_dir, rename};
use super::layout::{Layout, ReplicaState, data_name, meta_name};
use super::locate::metas_of;

/// The directory under a datanode's root.
pub const DIR: &str = "quarantine";

/// How long quarantined replicas are kept (HDFS keeps a trash for days;
/// this is the last copy of what a restored backup forgot).
pub const RETENTION: Duration = Duration::from_secs(14 * 24 * 3600);

/// One quarantined replica, as fsck lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quarantined {
    pub path: PathBuf,
    pub block: u64,
    /// When it was moved there (seconds since the epoch).
    pub since: u64,
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A fresh entry directory for `block`, created with its parents.
fn entry(l: &Layout, block: u64) -> Result<PathBuf, StorageError> {
    let root = l.root().join(DIR);
    let now = now_secs();
    // Two entries of one block in one second: a suffix keeps both.
    for n in 0.. {
        let name = match n {
            0 => format!("{now}-blk_{block}"),
            n => format!("{now}-blk_{block}.{n}"),
        };
        let dir = root.join(name);
        match fs::create_dir_all(&root).and_then(|_| fs::create_dir(&dir)) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(StorageError::io(&dir, e)),
        }
    }
    unreachable!("an unbounded range ends")
}

/// Moves every file of `block` here into a new quarantine entry; returns
/// it. Durable when it returns: the entry's and the old directories'.
pub(crate) fn quarantine(l: &Layout, block: u64) -> Result<PathBuf, StorageError> {
    let metas = metas_of(l, block)?;
    let dir = entry(l, block)?;
    let mut from = Vec::new();
    for s in ReplicaState::ALL {
        from.push((l.data_path(s, block), l.dir(s).to_path_buf()));
    }
    for m in &metas {
        from.push((l.meta_path(m.dir, block, m.gs), l.dir(m.dir).to_path_buf()));
    }
    from.push((l.note_path(block), l.dir(ReplicaState::Rbw).to_path_buf()));
    let mut touched = Vec::new();
    for (path, parent) in from {
        if !exists(&path)? {
            continue;
        }
        let name = path.file_name().map(PathBuf::from).unwrap_or_default();
        rename(&path, &dir.join(name))?;
        if !touched.contains(&parent) {
            touched.push(parent);
        }
    }
    fsync_dir(&dir)?;
    if let Some(root) = dir.parent() {
        fsync_dir(root)?;
    }
    for d in touched {
        fsync_dir(&d)?;
    }
    Ok(dir)
}

/// Copies replica `block`@`gs` (data and checksum file, whole) into a new
/// quarantine entry, durably, leaving it in place; returns the entry.
pub(crate) fn keep_copy(
    l: &Layout,
    state: ReplicaState,
    block: u64,
    gs: u64,
) -> Result<PathBuf, StorageError> {
    let dir = entry(l, block)?;
    for (from, name) in [
        (l.data_path(state, block), data_name(block)),
        (l.meta_path(state, block, gs), meta_name(block, gs)),
    ] {
        let to = dir.join(name);
        fs::copy(&from, &to).map_err(|e| StorageError::io(&from, e))?;
        fs::File::open(&to)
            .and_then(|f| f.sync_all())
            .map_err(|e| StorageError::io(&to, e))?;
    }
    fsync_dir(&dir)?;
    if let Some(root) = dir.parent() {
        fsync_dir(root)?;
    }
    Ok(dir)
}

/// The entries of the quarantine, oldest first.
pub(crate) fn list(l: &Layout) -> Result<Vec<Quarantined>, StorageError> {
    let root = l.root().join(DIR);
    let entries = match fs::read_dir(&root) {
        Ok(it) => it,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(StorageError::io(&root, e)),
    };
    let mut out = Vec::new();
    for e in entries {
        let e = e.map_err(|err| StorageError::io(&root, err))?;
        let name = e.file_name();
        let Some((since, block)) = name.to_str().and_then(parse_entry) else {
            continue;
        };
        out.push(Quarantined {
            path: e.path(),
            block,
            since,
        });
    }
    out.sort_by_key(|q| (q.since, q.block));
    Ok(out)
}

/// `<secs>-blk_<id>[.<n>]`.
fn parse_entry(name: &str) -> Option<(u64, u64)> {
    let (secs, rest) = name.split_once("-blk_")?;
    let id = rest.split('.').next()?;
    Some((secs.parse().ok()?, id.parse().ok()?))
}

/// Removes the entries older than `keep`; returns how many.
pub(crate) fn expire(l: &Layout, keep: Duration) -> Result<usize, StorageError> {
    let cutoff = now_secs().saturating_sub(keep.as_secs());
    let mut n = 0;
    for q in list(l)? {
        if q.since >= cutoff {
            break;
        }
        fs::remove_dir_all(&q.path).map_err(|e| StorageError::io(&q.path, e))?;
        n += 1;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::DnId;

    #[test]
    fn entry_names_parse_back() {
        assert_eq!(parse_entry("1700000000-blk_42"), Some((1_700_000_000, 42)));
        assert_eq!(
            parse_entry("1700000000-blk_42.3"),
            Some((1_700_000_000, 42))
        );
        assert_eq!(parse_entry("blk_42"), None);
    }

    #[test]
    fn a_quarantined_replica_moves_whole_and_expires_after_the_retention() {
        let dir = tempfile::tempdir().unwrap();
        let l = Layout::new(DnId(0), dir.path());
        for s in ReplicaState::ALL {
            fs::create_dir_all(l.dir(s)).unwrap();
        }
        fs::write(l.data_path(ReplicaState::Finalized, 7), b"data").unwrap();
        fs::write(l.meta_path(ReplicaState::Finalized, 7, 1001), b"meta").unwrap();
        let q = quarantine(&l, 7).unwrap();
        assert!(!l.data_path(ReplicaState::Finalized, 7).exists());
        assert_eq!(fs::read(q.join("blk_7")).unwrap(), b"data");
        assert_eq!(fs::read(q.join("blk_7_1001.meta")).unwrap(), b"meta");
        let listed = list(&l).unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].block, 7);
        assert_eq!(expire(&l, RETENTION).unwrap(), 0);
        assert!(q.exists());
        // Dated back past the retention: gone.
        let old = format!("{}-blk_7", now_secs() - RETENTION.as_secs() - 10);
        fs::rename(&q, l.root().join(DIR).join(old)).unwrap();
        assert_eq!(expire(&l, RETENTION).unwrap(), 1);
        assert!(list(&l).unwrap().is_empty());
    }
}
