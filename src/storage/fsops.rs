//! Positional reads that fill their buffer, and the length of an open
//! file with its path in errors. (Opening, renaming and removing go
//! through the directory descriptors of [`super::at`].)

use std::fs::File;
use std::io::{self, IoSliceMut};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::error::StorageError;

/// Length of the open file `f` (opened from `path`), read without its
/// times: a replica's next sync then writes no inode for it (see
/// `crate::fsstat`).
pub(crate) fn file_len(f: &File, path: &Path) -> Result<u64, StorageError> {
    crate::fsstat::len(f).map_err(|e| StorageError::io(path, e))
}

/// `pread` until `buf` is full or end of file; returns the bytes read.
pub(crate) fn read_full_at(f: &File, buf: &mut [u8], mut offset: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match f.read_at(&mut buf[done..], offset) {
            Ok(0) => break,
            Ok(n) => {
                done += n;
                offset += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// Whether a read may wait for the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wait {
    Yes,
    /// Only bytes already in the page cache (`RWF_NOWAIT`): a read that
    /// would wait fails with `WouldBlock`, so that a request thread can
    /// serve what memory holds and leave the rest to the blocking pool. A
    /// filesystem that cannot tell (`EOPNOTSUPP`) reports `WouldBlock` too.
    No,
}

/// [`read_full_at`] that waits for the disk only if `wait` says so.
pub(crate) fn read_full_at_as(
    f: &File,
    buf: &mut [u8],
    offset: u64,
    wait: Wait,
) -> io::Result<usize> {
    match wait {
        Wait::Yes => read_full_at(f, buf, offset),
        Wait::No => preadv_full_as(f, &mut [IoSliceMut::new(buf)], offset, wait),
    }
}

/// `preadv` until every buffer is full or end of file; returns the bytes
/// read. One system call in the usual case. It waits for the disk only if
/// `wait` says so: a read without waiting that the page cache holds only
/// in part returns what it holds, and the next call of the loop then
/// fails with `WouldBlock`.
pub(crate) fn preadv_full_as(
    f: &File,
    bufs: &mut [IoSliceMut<'_>],
    mut offset: u64,
    wait: Wait,
) -> io::Result<usize> {
    let flags = match wait {
        Wait::Yes => 0,
        Wait::No => libc::RWF_NOWAIT,
    };
    let mut bufs = bufs;
    IoSliceMut::advance_slices(&mut bufs, 0);
    let mut done = 0;
    while !bufs.is_empty() {
        let off = libc::off_t::try_from(offset)
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // (nix has no `preadv2`.)
        // SAFETY: `IoSliceMut` is ABI-compatible with `iovec` on Unix, and
        // every slice is a live, exclusively borrowed buffer; the count is
        // at most 3 here (far below IOV_MAX).
        let n = unsafe {
            libc::preadv2(
                f.as_raw_fd(),
                bufs.as_ptr().cast::<libc::iovec>(),
                bufs.len() as libc::c_int,
                off,
                flags,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN | libc::EOPNOTSUPP) if wait == Wait::No => {
                    return Err(io::ErrorKind::WouldBlock.into());
                }
                _ => return Err(e),
            }
        }
        if n == 0 {
            break;
        }
        let n = n as usize;
        done += n;
        offset += n as u64;
        IoSliceMut::advance_slices(&mut bufs, n);
    }
    Ok(done)
}
