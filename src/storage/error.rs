//! The storage layer's error type: each variant carries the facts needed to
//! report it (which replica, which offset), and the errno it becomes.

use std::io;
use std::path::{Path, PathBuf};

use super::dnid::DnId;

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
    /// A directory another user could change (see [`super::trust`]).
    #[error(
        "{} refused: {why}; another user could make the daemon create or delete files elsewhere (SEMANTICS.md, \"Datanode directories\")",
        .path.display()
    )]
    Untrusted { path: PathBuf, why: String },
    /// A packet that does not continue the replica (caller bug).
    #[error("bad packet for {}: {reason}", .path.display())]
    BadPacket { path: PathBuf, reason: String },
    /// A read that was not to wait for the disk would have (see
    /// `fsops::Wait::No`): the caller reads again where it may wait.
    #[error("the bytes are not in memory")]
    WouldBlock,
}

impl StorageError {
    /// Wraps an I/O error on `path`; `ENOSPC` and `EDQUOT` become
    /// [`StorageError::NoSpace`].
    pub fn io(path: &Path, source: io::Error) -> Self {
        if source.raw_os_error().is_none() && source.kind() == io::ErrorKind::WouldBlock {
            // Only `fsops::preadv_full_as` makes one (an errno is kept
            // as the errno it is).
            return StorageError::WouldBlock;
        }
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
            StorageError::WouldBlock => libc::EAGAIN,
            StorageError::Io { .. }
            | StorageError::Corrupt { .. }
            | StorageError::Missing { .. }
            | StorageError::StaleGenStamp { .. }
            | StorageError::NewerReplica { .. }
            | StorageError::BadMeta { .. }
            | StorageError::BadIdentity { .. }
            | StorageError::OtherIdentity { .. }
            | StorageError::TooShort { .. }
            | StorageError::BadPacket { .. }
            | StorageError::Untrusted { .. } => libc::EIO,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
