//! Replica reads that bypass the datanode's page cache (`O_DIRECT`).
//!
//! Why. A byte read through FUSE is cached twice when the daemon reads
//! its replica through the page cache: once under the replica, once under
//! the leasefs file (the copy the kernel keeps and serves again). On a
//! cold sequential read that doubles the pages filled per byte, and on
//! this VM (whose freed pages go back to the host) filling a page is what
//! a cold read costs (benches/PROFILE.md, "Cold reads: the bytes cached
//! once"). So a read of a finalized replica that would wait for the disk
//! reads it straight into an aligned buffer and copies the
//! bytes out of it, and the only cached copy is the leasefs file's, as on
//! a native filesystem. A replica already in the page cache (just
//! written, or read by another path) is still served from there.
//!
//! The aligned buffers are shared by the daemon and bounded ([`BUFFERS`]):
//! each direct read copies its bytes out of one, so the read itself lands
//! in memory touched before, not in fresh pages.

use std::fs::File;
use std::io::{self, IoSliceMut};
use std::os::fd::AsRawFd;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// `O_DIRECT` offsets, lengths and buffers are aligned to this: the
/// logical block size of every disk this runs on divides it.
const ALIGN: usize = 4096;
/// The largest read made so, after alignment: a FUSE read (at most 1 MiB)
/// with a block either side. Larger reads go through the page cache.
const MAX: usize = (1 << 20) + 2 * ALIGN;
/// Aligned buffers the daemon keeps at most, in use or free. A read that
/// finds none free goes through the page cache, so that no number of
/// concurrent readers (any user may start as many as they like) makes the
/// daemon hold more than `BUFFERS × MAX` bytes for this.
const BUFFERS: usize = 32;

/// [`MAX`] bytes of [`ALIGN`]-aligned memory, reused from read to read so
/// that a direct read lands in pages touched before.
struct Aligned(std::ptr::NonNull<u8>);

// SAFETY: the buffer is plain memory owned by whoever holds the value.
unsafe impl Send for Aligned {}

impl Aligned {
    fn layout() -> std::alloc::Layout {
        std::alloc::Layout::from_size_align(MAX, ALIGN).expect("MAX is a valid size")
    }
    fn new() -> Option<Aligned> {
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { std::alloc::alloc(Self::layout()) };
        std::ptr::NonNull::new(p).map(Aligned)
    }
    fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: a live allocation of `MAX` bytes owned by self; u8 has
        // no invalid values, and only bytes a read wrote are looked at.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_ptr(), MAX) }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this very layout.
        unsafe { std::alloc::dealloc(self.0.as_ptr(), Self::layout()) }
    }
}

/// Free buffers, and how many exist in all.
static FREE: Mutex<(Vec<Aligned>, usize)> = Mutex::new((Vec::new(), 0));

/// A buffer from [`FREE`], given back when dropped.
struct Lent(Option<Aligned>);

impl Lent {
    fn take() -> Option<Lent> {
        let mut free = FREE.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(b) = free.0.pop() {
            return Some(Lent(Some(b)));
        }
        if free.1 >= BUFFERS {
            return None;
        }
        let b = Aligned::new()?;
        free.1 += 1;
        Some(Lent(Some(b)))
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        if let Some(b) = self.0.take() {
            FREE.lock().unwrap_or_else(|e| e.into_inner()).0.push(b);
        }
    }
}

/// A second descriptor of `f`'s file opened with `O_DIRECT`, or `None`
/// where its filesystem refuses it (tmpfs before Linux 6.6, some FUSE
/// filesystems). Reopened through `/proc/self/fd`, so it is the same
/// inode even if the file was renamed since `f` was opened.
pub fn reopen(f: &File) -> Option<File> {
    use nix::fcntl::OFlag;
    let path = format!("/proc/self/fd/{}", f.as_raw_fd());
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECT | OFlag::O_CLOEXEC;
    let fd = nix::fcntl::open(path.as_str(), flags, nix::sys::stat::Mode::empty()).ok()?;
    Some(File::from(fd))
}

/// Whether every page of `[offset, offset + len)` of `f` is in the page
/// cache, asked without touching it (`cachestat(2)`, Linux 6.5). `None`
/// where the kernel cannot tell.
pub fn cached(f: &File, offset: u64, len: u64) -> Option<bool> {
    #[repr(C)]
    struct Range {
        off: u64,
        len: u64,
    }
    #[repr(C)]
    #[derive(Default)]
    struct Stat {
        cache: u64,
        dirty: u64,
        writeback: u64,
        evicted: u64,
        recently_evicted: u64,
    }
    const SYS_CACHESTAT: libc::c_long = 451;
    let page = 4096u64;
    let first = offset / page * page;
    let range = Range {
        off: first,
        len: (offset + len).div_ceil(page) * page - first,
    };
    let mut st = Stat::default();
    // SAFETY: both structs are the kernel's layout (`struct
    // cachestat_range`, `struct cachestat`), live for the call.
    let r = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            f.as_raw_fd(),
            &range as *const Range,
            &mut st as *mut Stat,
            0u32,
        )
    };
    (r == 0).then_some(st.cache * page >= range.len)
}

/// Whether reads of finalized replicas that would wait for the disk go
/// past the page cache: the mount option `replica_reads=direct` (the
/// default) or `cached`. One setting per process, as one daemon serves
/// one mount.
static ENABLED: AtomicBool = AtomicBool::new(true);

pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Sets [`enabled`] (from the mount options, before the mount serves).
pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// Reads `[offset, offset + Σ bufs)` of `direct` (an `O_DIRECT`
/// descriptor) into `bufs`, through one of the shared aligned buffers: the
/// bytes read, fewer at the end of the file. `offset` need not be
/// aligned. `None` where the read cannot be made so (too large, every
/// buffer in use, or `EINVAL`: a disk whose logical blocks are larger
/// than [`ALIGN`]); the caller then reads through the page cache, as it
/// would anyway.
pub fn read_into(
    direct: &File,
    bufs: &mut [IoSliceMut<'_>],
    offset: u64,
) -> Option<io::Result<usize>> {
    let total: usize = bufs.iter().map(|b| b.len()).sum();
    let start = offset / ALIGN as u64 * ALIGN as u64;
    let lead = (offset - start) as usize;
    let len = (lead + total).div_ceil(ALIGN) * ALIGN;
    if len > MAX {
        return None;
    }
    match read_aligned(direct, bufs, start, lead, len, total)? {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => None,
        r => Some(r),
    }
}

fn read_aligned(
    direct: &File,
    bufs: &mut [IoSliceMut<'_>],
    start: u64,
    lead: usize,
    len: usize,
    total: usize,
) -> Option<io::Result<usize>> {
    let mut lent = Lent::take()?;
    let buf = lent.0.as_mut().expect("lent until dropped").as_mut();
    let mut got = 0;
    // Short only at the end of the file (or on a signal): an unaligned
    // count means the end was reached.
    while got < len {
        match nix::sys::uio::pread(direct, &mut buf[got..len], (start + got as u64) as i64) {
            Ok(0) => break,
            Ok(n) => {
                got += n;
                if n % ALIGN != 0 {
                    break;
                }
            }
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Some(Err(e.into())),
        }
    }
    let mut avail = got.saturating_sub(lead).min(total);
    let n = avail;
    let mut src = &buf[lead..lead + avail];
    for b in bufs.iter_mut() {
        let k = b.len().min(avail);
        b[..k].copy_from_slice(&src[..k]);
        src = &src[k..];
        avail -= k;
    }
    Some(Ok(n))
}
