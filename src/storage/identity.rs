//! A datanode directory's identity file, `DN/VERSION` (as HDFS's DataNode
//! `VERSION` file): the directory's storage ID, the ID of the leasefs
//! filesystem it belongs to, and its layout version. Replicas are recorded
//! under the compact id the metadata's datanode registry gives a storage
//! ID, so a directory is recognised by this file wherever it sits in the
//! `--datanode` list (see docs/SEMANTICS.md, "Replication and faults").
//!
//! The file is a few `key=value` lines and is only ever created whole: it
//! is written to a temporary name, synced, linked into place (which fails
//! if another daemon created it first: then its file wins), and the
//! directory is synced. A layout upgrade replaces it whole the same way,
//! keeping both IDs (renamed into place rather than linked).
//!
//! Layout versions: 0 the positional layout (no identity file; replicas
//! recorded by place in the `--datanode` list); 1 identity files; 2 a
//! replica being written may be longer than its data (zero-filled ahead of
//! a writer that syncs often, its checksums saying where the data ends),
//! and a small file's replicas may be written straight into `finalized/`.
//! Each is upgraded in place at mount; a release refuses a directory of a
//! layout newer than its own, whose replicas it could misread.

use std::io;
use std::path::Path;

use nix::errno::Errno;

use super::at::DirFd;
use super::error::StorageError;
/// Re-exported: block rows name replicas by it (see [`super::layout`]).
pub use super::layout::DnId;

/// The identity file's name in a datanode directory.
pub const FILE_NAME: &str = "VERSION";

/// Layout version written by this release (see the module doc).
pub const LAYOUT_VERSION: u32 = 2;

/// The contents of an identity file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// `DS-<uuid>`, unique to the directory.
    pub storage_id: String,
    /// The ID of the filesystem whose metadata records this datanode.
    pub filesystem_id: String,
    pub layout_version: u32,
}

impl Identity {
    /// A fresh storage of filesystem `filesystem_id`.
    pub fn new(filesystem_id: &str) -> Identity {
        Identity::of(new_storage_id(), filesystem_id)
    }

    /// Storage `storage_id` of filesystem `filesystem_id`, at this layout.
    pub fn of(storage_id: String, filesystem_id: &str) -> Identity {
        Identity {
            storage_id,
            filesystem_id: filesystem_id.to_string(),
            layout_version: LAYOUT_VERSION,
        }
    }

    pub(crate) fn encode(&self) -> String {
        format!(
            "# leasefs datanode identity: do not edit or copy to another directory\n\
             storageID={}\nfilesystemID={}\nlayoutVersion={}\n",
            self.storage_id, self.filesystem_id, self.layout_version
        )
    }

    pub(crate) fn decode(path: &Path, text: &str) -> Result<Identity, StorageError> {
        let bad = |reason: String| StorageError::BadIdentity {
            path: path.to_path_buf(),
            reason,
        };
        let (mut sid, mut fsid, mut layout) = (None, None, None);
        for line in text.lines().map(str::trim) {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (k, v) = line
                .split_once('=')
                .ok_or_else(|| bad(format!("line without '=': {line:?}")))?;
            match k.trim() {
                "storageID" => sid = Some(v.trim().to_string()),
                "filesystemID" => fsid = Some(v.trim().to_string()),
                "layoutVersion" => {
                    layout = Some(
                        v.trim()
                            .parse::<u32>()
                            .map_err(|_| bad(format!("bad layoutVersion {v:?}")))?,
                    )
                }
                // Keys of later releases are kept out of the way.
                _ => {}
            }
        }
        let id = Identity {
            storage_id: sid
                .filter(|s| !s.is_empty())
                .ok_or_else(|| bad("no storageID".into()))?,
            filesystem_id: fsid
                .filter(|s| !s.is_empty())
                .ok_or_else(|| bad("no filesystemID".into()))?,
            layout_version: layout.ok_or_else(|| bad("no layoutVersion".into()))?,
        };
        if id.layout_version > LAYOUT_VERSION {
            return Err(bad(format!(
                "layout version {} is newer than this release's ({LAYOUT_VERSION})",
                id.layout_version
            )));
        }
        Ok(id)
    }
}

/// A new, unique storage ID.
pub fn new_storage_id() -> String {
    format!("DS-{}", uuid::Uuid::new_v4())
}

/// A new, unique filesystem ID.
pub fn new_filesystem_id() -> String {
    format!("FS-{}", uuid::Uuid::new_v4())
}

/// The identity file of the datanode directory `root`, if it has one.
pub fn read(root: &Path) -> Result<Option<Identity>, StorageError> {
    read_in(&DirFd::open_trusted(root)?)
}

/// As [`read`], in the directory held as `dir`.
pub(crate) fn read_in(dir: &DirFd) -> Result<Option<Identity>, StorageError> {
    let path = dir.path.join(FILE_NAME);
    dir.read_text(FILE_NAME)?
        .map(|text| Identity::decode(&path, &text))
        .transpose()
}

/// Brings the identity file of `root` (`id`, as read from it) to this
/// release's layout version, keeping its storage and filesystem IDs.
/// Nothing else in the directory changes: every replica of an older
/// layout is valid in this one. The new file is written to a temporary
/// name, synced, renamed over the old one and the directory synced, so a
/// crash leaves one file or the other, of this same datanode.
pub fn upgrade(root: &Path, id: &Identity) -> Result<Identity, StorageError> {
    if id.layout_version >= LAYOUT_VERSION {
        return Ok(id.clone());
    }
    let new = Identity {
        layout_version: LAYOUT_VERSION,
        ..id.clone()
    };
    DirFd::open_trusted(root)?.replace_durably(FILE_NAME, new.encode().as_bytes())?;
    Ok(new)
}

/// Gives `root` the identity `id` unless it already has one, crash-safely
/// (temp file, fsync, link into place, fsync of the directory); returns the
/// identity the directory has afterwards, which is another one when a
/// concurrent daemon wrote its file first.
pub fn create(root: &Path, id: &Identity) -> Result<Identity, StorageError> {
    create_in(&DirFd::open_trusted(root)?, id)
}

/// As [`create`], in the directory held as `dir`.
pub(crate) fn create_in(dir: &DirFd, id: &Identity) -> Result<Identity, StorageError> {
    let path = dir.path.join(FILE_NAME);
    let tmp = dir.write_synced_temp(FILE_NAME, id.encode().as_bytes())?;
    // A link, not a rename: it never replaces an identity file that
    // appeared meanwhile.
    let linked = dir.link(&tmp, FILE_NAME);
    let _ = dir.unlink(&tmp);
    match linked {
        Ok(()) | Err(Errno::EEXIST) => {}
        Err(e) => return Err(StorageError::io(&path, io::Error::from(e))),
    }
    dir.fsync()?;
    read_in(dir)?.ok_or_else(|| StorageError::BadIdentity {
        path,
        reason: "vanished right after it was written".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn an_older_layout_is_upgraded_in_place_keeping_both_ids() {
        let dir = tempfile::tempdir().unwrap();
        let old = Identity {
            layout_version: 1,
            ..Identity::new("FS-1")
        };
        create(dir.path(), &old).unwrap();
        assert_eq!(read(dir.path()).unwrap().unwrap().layout_version, 1);
        let new = upgrade(dir.path(), &old).unwrap();
        assert_eq!(new.layout_version, LAYOUT_VERSION);
        assert_eq!(
            (&new.storage_id, &new.filesystem_id),
            (&old.storage_id, &old.filesystem_id)
        );
        assert_eq!(read(dir.path()).unwrap(), Some(new.clone()));
        // Nothing else is left in the directory; upgrading again is a no-op.
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names, [FILE_NAME]);
        assert_eq!(upgrade(dir.path(), &new).unwrap(), new);
    }

    #[test]
    fn an_identity_survives_a_round_trip_and_is_never_replaced() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path()).unwrap(), None);
        let a = Identity::new("FS-1");
        assert!(a.storage_id.starts_with("DS-"));
        assert_eq!(create(dir.path(), &a).unwrap(), a);
        assert_eq!(read(dir.path()).unwrap(), Some(a.clone()));
        // A second writer (another daemon, a retried upgrade) gets the
        // identity already there.
        let b = Identity::new("FS-1");
        assert_ne!(a.storage_id, b.storage_id);
        assert_eq!(create(dir.path(), &b).unwrap(), a);
        // No temporary file is left behind.
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from(FILE_NAME)]);
    }

    #[test]
    fn a_bad_or_newer_identity_file_is_an_error_not_a_guess() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(FILE_NAME);
        for (text, why) in [
            ("storageID=DS-1\nlayoutVersion=1\n", "no filesystemID"),
            ("storageID=DS-1\nfilesystemID=FS-1\n", "no layoutVersion"),
            ("garbage\n", "without '='"),
            (
                "storageID=DS-1\nfilesystemID=FS-1\nlayoutVersion=99\n",
                "newer",
            ),
        ] {
            fs::write(&p, text).unwrap();
            let e = read(dir.path()).unwrap_err().to_string();
            assert!(e.contains(why), "{text:?}: {e}");
        }
        fs::write(
            &p,
            "# comment\nstorageID=DS-1\nfilesystemID=FS-1\nlayoutVersion=1\nlater=x\n",
        )
        .unwrap();
        assert_eq!(
            read(dir.path()).unwrap(),
            Some(Identity {
                layout_version: 1,
                ..Identity::of("DS-1".into(), "FS-1")
            })
        );
    }
}
