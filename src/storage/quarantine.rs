//! The quarantine: where replicas the metadata does not know go instead of
//! being deleted. An unknown replica is a guess (a `meta.db` restored from
//! a backup, or a copy of the data directory pointed at the same
//! datanodes, makes every newer replica look unknown), and a guess never
//! earns an irreversible delete: the files move, by rename, to
//! `DN/quarantine/<unix seconds>-blk_<id>/`, where an operator can look at
//! them (`fsck` lists them) until housekeeping removes them after
//! [`RETENTION`]. A replica about to be cut shorter than it is on a guess
//! (adopting a stamp the metadata never recorded) is copied there first.

use std::io;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nix::fcntl::OFlag;
use serde::{Deserialize, Serialize};

use super::at::{DirFd, Sub};
use super::error::StorageError;
use super::layout::{Layout, ReplicaState};
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

/// The quarantine directory of the datanode, created when `create`;
/// `None` when it has none and not `create`.
fn qdir(l: &Layout, create: bool) -> Result<Option<DirFd>, StorageError> {
    l.fds().dir(Sub::Root).child_dir(DIR, create)
}

/// A fresh entry directory for `block` in `q`.
fn entry(q: &DirFd, block: u64) -> Result<DirFd, StorageError> {
    let now = now_secs();
    // Two entries of one block in one second: a suffix keeps both.
    for n in 0.. {
        let name = match n {
            0 => format!("{now}-blk_{block}"),
            n => format!("{now}-blk_{block}.{n}"),
        };
        if q.mkdir_new(&name)? {
            return q.child_dir(&name, false)?.ok_or_else(|| {
                StorageError::io(&q.path.join(&name), io::ErrorKind::NotFound.into())
            });
        }
    }
    unreachable!("an unbounded range ends")
}

/// Moves every file of `block` here into a new quarantine entry; returns
/// it. Durable when it returns: the entry's and the old directories'.
pub(crate) fn quarantine(l: &Layout, block: u64) -> Result<PathBuf, StorageError> {
    let metas = metas_of(l, block)?;
    let q = qdir(l, true)?
        .ok_or_else(|| StorageError::io(&l.root().join(DIR), io::ErrorKind::NotFound.into()))?;
    let dir = entry(&q, block)?;
    let mut from = Vec::new();
    for s in ReplicaState::ALL {
        from.push(l.data(s, block));
    }
    for m in &metas {
        from.push(l.meta(m.dir, block, m.gs));
    }
    from.push(l.note(block));
    let mut touched = Vec::new();
    for at in from {
        if !at.exists()? {
            continue;
        }
        at.move_into(&dir)?;
        if !touched.contains(&at.sub) {
            touched.push(at.sub);
        }
    }
    dir.fsync()?;
    q.fsync()?;
    let fds = l.fds();
    for s in touched {
        fds.fsync(s)?;
    }
    Ok(dir.path)
}

/// Copies replica `block`@`gs` (data and checksum file, whole) into a new
/// quarantine entry, durably, leaving it in place; returns the entry.
pub(crate) fn keep_copy(
    l: &Layout,
    state: ReplicaState,
    block: u64,
    gs: u64,
) -> Result<PathBuf, StorageError> {
    let q = qdir(l, true)?
        .ok_or_else(|| StorageError::io(&l.root().join(DIR), io::ErrorKind::NotFound.into()))?;
    let dir = entry(&q, block)?;
    for from in [l.data(state, block), l.meta(state, block, gs)] {
        let to = dir.path.join(&from.name);
        let mut src = from.open_read()?;
        let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL;
        let mut dst = dir
            .open_file(&from.name, flags)
            .map_err(|e| StorageError::io(&to, e.into()))?;
        io::copy(&mut src, &mut dst)
            .and_then(|_| dst.sync_all())
            .map_err(|e| StorageError::io(&to, e))?;
    }
    dir.fsync()?;
    q.fsync()?;
    Ok(dir.path)
}

/// The entries of the quarantine, oldest first.
pub(crate) fn list(l: &Layout) -> Result<Vec<Quarantined>, StorageError> {
    let Some(q) = qdir(l, false)? else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for name in q.names()? {
        let Some((since, block)) = parse_entry(&name) else {
            continue;
        };
        out.push(Quarantined {
            path: q.path.join(name),
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
    let Some(dir) = qdir(l, false)? else {
        return Ok(0);
    };
    let mut n = 0;
    for q in list(l)? {
        if q.since >= cutoff {
            break;
        }
        // Through the descriptors: nothing a link there points to goes.
        if let Some(name) = q.path.file_name().and_then(|n| n.to_str()) {
            dir.remove_tree(name)?;
            n += 1;
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::DnId;
    use std::fs;

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
        let l = Layout::open(DnId(0), dir.path()).unwrap();
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
