//! A datanode's own health: the heartbeat probe (identity file, a synced
//! write, free space) and what a directory holds before it is attached.

use std::collections::BTreeSet;
use std::fs::{self, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::{Datanode, FileName, ReplicaState, StorageError, TMP_SEQ, parse_name};
use crate::storage::identity;
use crate::sync::Ordering;

impl Datanode {
    /// The datanode heartbeat: proves the directory is still this datanode
    /// (its identity file) and can be written (a small probe file in `tmp/`
    /// is written, fsynced and removed), and returns the bytes free for
    /// unprivileged use. A full disk fails the probe with
    /// [`StorageError::NoSpace`]: the caller counts that as full, not dead.
    pub fn heartbeat(&self) -> Result<u64, StorageError> {
        // A datanode whose directory came back (recreated, remounted) gets
        // its layout and identity file again; a root that is gone stays
        // dead rather than being recreated on whatever filesystem lies
        // below it, and a directory that now holds another datanode is
        // never taken for this one.
        if self.root.is_dir() {
            if let Some(want) = &self.identity {
                let found = match identity::read(&self.root)? {
                    Some(found) => found,
                    None => identity::create(&self.root, want)?,
                };
                if found.storage_id != want.storage_id || found.filesystem_id != want.filesystem_id
                {
                    return Err(StorageError::OtherIdentity {
                        path: self.root.clone(),
                        found: found.storage_id,
                        wanted: want.storage_id.clone(),
                    });
                }
            }
            for d in [
                &self.tmp,
                self.dir(ReplicaState::Rbw),
                self.dir(ReplicaState::Finalized),
            ] {
                fs::create_dir_all(d).map_err(|e| StorageError::io(d, e))?;
            }
        }
        let seq = TMP_SEQ.fetch_add(1, Ordering::Relaxed);
        let probe = self
            .tmp
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
        self.free_bytes()
    }

    /// Bytes free for unprivileged use on the datanode's filesystem.
    pub fn free_bytes(&self) -> Result<u64, StorageError> {
        let st = nix::sys::statvfs::statvfs(&self.root)
            .map_err(|e| StorageError::io(&self.root, io::Error::from(e)))?;
        Ok((st.blocks_available() as u64).saturating_mul(st.fragment_size() as u64))
    }

    /// The blocks whose data files `root`'s `rbw/` and `finalized/` hold,
    /// read without changing anything (the directory is not attached yet).
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

    /// Whether `rbw/` or `finalized/` holds any file: a directory without
    /// an identity file that holds some is never taken for a new datanode.
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::DnId;
    use crate::storage::identity::Identity;

    fn dn(dir: &tempfile::TempDir, index: u32) -> Datanode {
        Datanode::open(DnId(index), &dir.path().join(format!("dn{index}")), None).unwrap()
    }

    #[test]
    fn heartbeat_probes_and_reports_free_space() {
        let dir = tempfile::tempdir().unwrap();
        let dn = dn(&dir, 0);
        assert!(dn.heartbeat().unwrap() > 0);
        assert_eq!(fs::read_dir(dn.root.join("tmp")).unwrap().count(), 0);
        // A datanode whose directory is gone fails its heartbeat.
        fs::remove_dir_all(&dn.root).unwrap();
        assert!(matches!(dn.heartbeat(), Err(StorageError::Io { .. })));
    }

    #[test]
    fn heartbeat_checks_the_identity_file_and_restores_it_in_a_recreated_directory() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("dn");
        fs::create_dir_all(&root).unwrap();
        let me = identity::create(&root, &Identity::new("FS-1")).unwrap();
        let dn = Datanode::open(DnId(4), &root, Some(me.clone())).unwrap();
        dn.heartbeat().unwrap();
        // Emptied and recreated by the operator: the same storage again.
        fs::remove_dir_all(&root).unwrap();
        fs::create_dir_all(&root).unwrap();
        dn.heartbeat().unwrap();
        assert_eq!(identity::read(&root).unwrap(), Some(me.clone()));
        // Another datanode's directory mounted at the same path is not it.
        fs::remove_dir_all(&root).unwrap();
        fs::create_dir_all(&root).unwrap();
        identity::create(&root, &Identity::new("FS-1")).unwrap();
        assert!(matches!(
            dn.heartbeat(),
            Err(StorageError::OtherIdentity { .. })
        ));
    }
}
