//! Open file descriptions (FUSE file handles) and the per-inode state they
//! share: the one output stream of a file and how many opens remain.

use crate::pipeline::OutputStream;
use crate::sync::{Arc, AtomicBool, AtomicU8, Mutex};

/// One open file description.
pub struct Handle {
    pub fh: u64,
    pub ino: u64,
    pub write: bool,
    pub append: bool,
    /// Opened `O_SYNC`/`O_DSYNC`: every write returns durable, as after an
    /// fsync. The kernel follows a write with an fsync only on page-cache
    /// files; write handles are direct I/O, so leasefs does it.
    pub sync_writes: bool,
    /// Reads go through the kernel's page cache (see `cache`).
    pub cached: bool,
    pub epoch: u64,
    pub tgid: u32,
    /// The election term's fence of the process that opened it, if any:
    /// writes through it are refused once that term is over.
    pub fence: Option<u32>,
    /// The opener's uid: who may see a write handle's holder details.
    pub uid: u32,
    /// Flushed (close()) with no write since: a conflicting open may wait
    /// for this handle's pending RELEASE instead of failing.
    pub flushed: AtomicBool,
    pub stream: Option<Arc<OutputStream>>,
}

/// Per-inode state while any handle is open.
#[derive(Default)]
pub struct OpenFile {
    pub opens: Mutex<usize>,
    pub stream: Mutex<Option<Arc<OutputStream>>>,
    /// What a write must drop first (`privs::MODE`, `privs::CAPS`), as
    /// known since a writer opened the file; kept current by this daemon's
    /// chmod and setxattr.
    pub privs: AtomicU8,
}
