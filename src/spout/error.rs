//! The spout's error type. Only conditions that stop the whole consumer are
//! errors here; a file that is bad, or whose lock was lost to another
//! instance, is an outcome of that file, not an error of the run.

use std::path::PathBuf;

/// Why a spout run stopped.
#[derive(Debug, thiserror::Error)]
pub enum SpoutError {
    /// A configuration value that cannot work (caught before touching files).
    #[error("{0}")]
    Config(String),
    /// A directory the spout needs could not be created or used.
    #[error("{what} directory {path}: {source}")]
    Dir {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    /// Moves into the done and bad directories are renames, which cannot
    /// cross filesystems; caught at start instead of after the first file.
    #[error(
        "{what} directory {path} is not on the same filesystem as the source directory {source_dir}"
    )]
    CrossDevice {
        what: &'static str,
        path: PathBuf,
        source_dir: PathBuf,
    },
    /// The lock directory is not on leasefs (no lease attribute, or the
    /// client-renewal ioctl is refused): without leases a stopped instance
    /// could never be told apart from a live one, so the spout refuses to
    /// run.
    #[error("{path} is not on a leasefs mount ({source}); the spout's locks need leasefs leases")]
    NotLeasefs {
        path: PathBuf,
        source: std::io::Error,
    },
    /// An I/O failure on a path the spout cannot do without.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The record consumer failed (closed stdout, `--exec` command died).
    #[error("output: {0}")]
    Emit(#[from] EmitError),
}

/// Why records could not be handed on.
#[derive(Debug, thiserror::Error)]
pub enum EmitError {
    #[error("cannot start `{cmd}`: {source}")]
    Spawn { cmd: String, source: std::io::Error },
    #[error("`{cmd}` stopped reading its input ({source})")]
    CommandGone { cmd: String, source: std::io::Error },
    #[error("`{cmd}` exited with {status}")]
    CommandFailed {
        cmd: String,
        status: std::process::ExitStatus,
    },
    #[error("standard output: {0}")]
    Stdout(std::io::Error),
    /// The consumer neither took nor acknowledged a record for the
    /// progress timeout: it was killed (whole process tree) after
    /// acknowledging `acked` records of its file.
    #[error(
        "`{cmd}` made no progress for {quiet_ms} ms: killed after acknowledging {acked} records"
    )]
    Stalled {
        cmd: String,
        quiet_ms: u64,
        acked: u64,
    },
    /// The spout was asked to stop and the consumer did not finish what it
    /// was given within the grace: it was killed after acknowledging
    /// `acked` records (or it was not given all its records).
    #[error("`{cmd}` stopped with the spout after acknowledging {acked} records")]
    Stopped { cmd: String, acked: u64 },
}

impl EmitError {
    /// For a consumer that was given up (stalled, or stopped with the
    /// spout): how many of its file's records it acknowledged for good.
    pub fn acknowledged_before_kill(&self) -> Option<u64> {
        match self {
            EmitError::Stalled { acked, .. } | EmitError::Stopped { acked, .. } => Some(*acked),
            _ => None,
        }
    }
}

impl SpoutError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        SpoutError::Io {
            path: path.into(),
            source,
        }
    }
}

/// Why records could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The content is not records: the file goes to the bad directory.
    #[error("not a text file of records at byte {offset}: {reason}")]
    Invalid { offset: u64, reason: &'static str },
    #[error(transparent)]
    Io(#[from] std::io::Error),
}
