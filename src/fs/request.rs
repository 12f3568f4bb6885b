//! What a request of the filesystem carries and how it completes, shared by
//! the adapter, the filesystem type ([`super::Core`]) and its parts: who
//! asks, the completion callback, and how an open was granted.

use crate::error::FsResult;

/// Completion of a request, called from whichever thread finishes the
/// work (a lease grant, the stream worker, the blocking pool), never
/// while a lock is held.
pub type Reply<T> = Box<dyn FnOnce(FsResult<T>) + Send>;

/// Who is asking.
#[derive(Debug, Clone, Copy)]
pub struct Caller {
    pub pid: u32,
    pub uid: u32,
    pub gid: u32,
}

/// How an open was granted.
#[derive(Debug, Clone, Copy)]
pub struct Opened {
    pub fh: u64,
    /// Serve reads without the page cache (write opens, and read opens of
    /// a file that may change: see `cache`).
    pub direct_io: bool,
    /// Keep the kernel's pages of earlier opens (they match the file).
    pub keep_cache: bool,
}
