//! The filesystem's error type and the one place where errors become errnos.
//!
//! Each subsystem has its own `thiserror` enum carrying the facts of the
//! failure; [`FsError`] wraps them and [`FsError::errno`] is the only mapping
//! to what the kernel (and so the user) sees.

use crate::lease::LeaseError;
use crate::storage::StorageError;

#[derive(Debug, Clone, thiserror::Error)]
pub enum FsError {
    #[error("no such file or directory")]
    NotFound,
    #[error("file exists")]
    Exists,
    /// CREATE (without `O_EXCL`) found the name made since the kernel
    /// looked it up: `ESTALE` makes the kernel look again and open what
    /// it finds with its own permission checks (see `Core::create`).
    #[error("the name was made since the kernel looked it up")]
    Appeared,
    #[error("not a directory")]
    NotDir,
    #[error("is a directory")]
    IsDir,
    #[error("directory not empty")]
    NotEmpty,
    #[error("name too long")]
    NameTooLong,
    #[error("operation not permitted: {0}")]
    NotPermitted(&'static str),
    #[error("permission denied")]
    Access,
    #[error("invalid argument: {0}")]
    Invalid(String),
    #[error(
        "write at offset {got} but the file's end for this handle is {expected}: leasefs files are append-only"
    )]
    OutOfOrderWrite { expected: u64, got: u64 },
    #[error("no such attribute")]
    NoXattr,
    #[error("attribute buffer too small")]
    Range,
    #[error("extended attribute value of {len} bytes is over the limit of {max}")]
    XattrTooBig { len: usize, max: usize },
    #[error(
        "inode {ino} would hold {used} bytes of extended attributes, over the limit of {limit}"
    )]
    XattrSpace { ino: u64, used: u64, limit: u64 },
    #[error("bad file handle")]
    BadHandle,
    #[error("not supported: {0}")]
    Unsupported(&'static str),
    #[error("no space left on any datanode")]
    NoSpace,
    #[error("file handle is unusable after an earlier failure: {0}")]
    Poisoned(String),
    #[error("{0}")]
    Lease(#[from] LeaseError),
    #[error("the election term (epoch {epoch}) of this process group is over")]
    TermOver { epoch: u64 },
    #[error("{0}")]
    Storage(String, i32),
    #[error("metadata store: {0}")]
    Meta(String),
    /// A filesystem the daemon writes to (the metadata store's, or etcd's
    /// quota) is full: the caller sees `ENOSPC`, as on a local filesystem,
    /// not an I/O error.
    #[error("no space left on device: {0}")]
    Full(String),
    /// A datanode directory that cannot be attached (see
    /// `pipeline::attach::AttachError`).
    #[error("{0}")]
    Datanode(String),
    #[error("i/o error: {0}")]
    Io(String),
    /// A renewal the cluster did not confirm in time: it may succeed if
    /// tried again (the lease is not lost yet).
    #[error("not confirmed in time: {0}")]
    Unconfirmed(String),
    /// A read found replicas under another generation stamp than its block
    /// list said: the block changed under it; read again with a fresh list.
    #[error("block changed while reading: {0}")]
    Moved(String),
}

impl From<StorageError> for FsError {
    fn from(e: StorageError) -> Self {
        let errno = e.errno();
        FsError::Storage(e.to_string(), errno)
    }
}

impl From<rusqlite::Error> for FsError {
    fn from(e: rusqlite::Error) -> Self {
        if sqlite_full(&e) {
            FsError::Full(e.to_string())
        } else {
            FsError::Meta(e.to_string())
        }
    }
}

/// SQLite says `SQLITE_FULL` when a write to the database, its journal or
/// its WAL meets `ENOSPC` (or `EDQUOT`).
fn sqlite_full(e: &rusqlite::Error) -> bool {
    matches!(
        e,
        rusqlite::Error::SqliteFailure(f, _) if f.code == rusqlite::ErrorCode::DiskFull
    )
}

impl From<std::io::Error> for FsError {
    fn from(e: std::io::Error) -> Self {
        match e.raw_os_error() {
            Some(libc::ENOSPC) | Some(libc::EDQUOT) => FsError::Full(e.to_string()),
            _ => FsError::Io(e.to_string()),
        }
    }
}

impl FsError {
    /// The errno the kernel returns to the caller.
    pub fn errno(&self) -> i32 {
        use libc::*;
        match self {
            FsError::NotFound => ENOENT,
            FsError::Exists => EEXIST,
            FsError::Appeared => ESTALE,
            FsError::NotDir => ENOTDIR,
            FsError::IsDir => EISDIR,
            FsError::NotEmpty => ENOTEMPTY,
            FsError::NameTooLong => ENAMETOOLONG,
            FsError::NotPermitted(_) => EPERM,
            FsError::Access => EACCES,
            FsError::Invalid(_) => EINVAL,
            FsError::OutOfOrderWrite { .. } => EINVAL,
            FsError::NoXattr => ENODATA,
            FsError::Range => ERANGE,
            FsError::XattrTooBig { .. } => E2BIG,
            FsError::XattrSpace { .. } => ENOSPC,
            FsError::BadHandle => EBADF,
            FsError::Unsupported(_) => EOPNOTSUPP,
            FsError::NoSpace => ENOSPC,
            FsError::Poisoned(_) => EIO,
            FsError::Lease(e) => e.errno(),
            FsError::TermOver { .. } => EIO,
            FsError::Storage(_, errno) => *errno,
            FsError::Meta(_) => EIO,
            FsError::Full(_) => ENOSPC,
            FsError::Datanode(_) => EIO,
            FsError::Io(_) => EIO,
            FsError::Unconfirmed(_) => ETIMEDOUT,
            FsError::Moved(_) => EIO,
        }
    }
}

pub type FsResult<T> = Result<T, FsError>;
