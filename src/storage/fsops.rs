//! Positional reads that fill their buffer, and the length of an open
//! file with its path in errors. (Opening, renaming and removing go
//! through the directory descriptors of [`super::at`].)

use std::fs::File;
use std::io::{self, IoSliceMut};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::error::StorageError;

/// Length of the open file `f` (opened from `path`).
pub(crate) fn file_len(f: &File, path: &Path) -> Result<u64, StorageError> {
    f.metadata()
        .map(|m| m.len())
        .map_err(|e| StorageError::io(path, e))
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

/// `preadv` until every buffer is full or end of file; returns the bytes
/// read. One system call in the usual case.
pub(crate) fn preadv_full(
    f: &File,
    bufs: &mut [IoSliceMut<'_>],
    mut offset: u64,
) -> io::Result<usize> {
    let mut bufs = bufs;
    IoSliceMut::advance_slices(&mut bufs, 0);
    let mut done = 0;
    while !bufs.is_empty() {
        let off = libc::off_t::try_from(offset)
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: `IoSliceMut` is ABI-compatible with `iovec` on Unix, and
        // every slice is a live, exclusively borrowed buffer; the count is
        // at most 3 here (far below IOV_MAX).
        let n = unsafe {
            libc::preadv(
                f.as_raw_fd(),
                bufs.as_ptr().cast::<libc::iovec>(),
                bufs.len() as libc::c_int,
                off,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
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
