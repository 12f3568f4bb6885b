//! Facts about an open file that leave its times alone.
//!
//! Why. Since Linux 6.13, ext4, XFS, btrfs and tmpfs keep "multigrain"
//! timestamps: a change normally takes the coarse clock (one tick, a few
//! ms), so the many writes of a tick dirty the inode once; but once
//! anyone has *read* the file's ctime or mtime, the next change takes a
//! fine-grained time, which always differs, and dirties the inode. On
//! ext4 without a journal (and any filesystem that writes a dirty inode
//! at `fdatasync`) that inode is then written before the flush: a
//! `stat`/`fstat` (which asks for every field) between a write and its
//! `fdatasync` added a synchronous metadata write to every sync, some
//! 60 µs here (benches/PROFILE.md, "fifteenth look"). A `statx` that asks
//! only for the fields it needs reads no time and marks nothing.

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::AsFd;
use std::os::fd::AsRawFd;

/// `statx` of the open file `f` for the fields in `mask` only.
fn statx_of(f: &impl AsFd, mask: u32) -> io::Result<libc::statx> {
    let mut buf = MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: an empty path with AT_EMPTY_PATH names the descriptor
    // itself; `buf` is a valid, writable `struct statx` the kernel fills.
    // (nix offers no statx.)
    let r = unsafe {
        libc::statx(
            f.as_fd().as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            mask,
            buf.as_mut_ptr(),
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: zeroed is a valid `statx`, and the call succeeded.
    Ok(unsafe { buf.assume_init() })
}

/// The number of names of the open file `f` (0: it was removed).
pub fn nlink(f: &impl AsFd) -> io::Result<u64> {
    let st = statx_of(f, libc::STATX_NLINK)?;
    if st.stx_mask & libc::STATX_NLINK == 0 {
        return Err(io::Error::other("statx returned no link count"));
    }
    Ok(u64::from(st.stx_nlink))
}

/// The length of the open file `f`.
pub fn len(f: &impl AsFd) -> io::Result<u64> {
    let st = statx_of(f, libc::STATX_SIZE)?;
    if st.stx_mask & libc::STATX_SIZE == 0 {
        return Err(io::Error::other("statx returned no size"));
    }
    Ok(st.stx_size)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;
    use std::io::Write;
    use std::os::unix::fs::FileExt;
    use std::time::SystemTime;

    #[test]
    fn link_count_and_length_of_an_open_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let mut f = File::create(&p).unwrap();
        f.write_all(b"12345").unwrap();
        assert_eq!(len(&f).unwrap(), 5);
        assert_eq!(nlink(&f).unwrap(), 1);
        std::fs::hard_link(&p, dir.path().join("g")).unwrap();
        assert_eq!(nlink(&f).unwrap(), 2);
        std::fs::remove_file(&p).unwrap();
        std::fs::remove_file(dir.path().join("g")).unwrap();
        assert_eq!(nlink(&f).unwrap(), 0);
        assert_eq!(len(&f).unwrap(), 5);
    }

    /// Of `rounds` rounds of (write, `look`, write), how many gave the
    /// second write a fine-grained time: one taken after that write
    /// began. A coarse one (the tick's, or the newest fine-grained time
    /// handed out, which the first write's was) is never later than that.
    fn fine_second_writes(f: &File, rounds: usize, look: impl Fn(&File)) -> usize {
        let mut fine = 0;
        for i in 0..rounds {
            // Read (so the first write takes a fine-grained time).
            let _ = f.metadata().unwrap().modified().unwrap();
            f.write_all_at(b"a", i as u64).unwrap();
            look(f);
            let before = SystemTime::now();
            f.write_all_at(b"b", i as u64).unwrap();
            if f.metadata().unwrap().modified().unwrap() > before {
                fine += 1;
            }
        }
        fine
    }

    /// The reason this module exists: on a filesystem with multigrain
    /// timestamps (Linux 6.13+: ext4, XFS, btrfs, tmpfs), a `stat` of a
    /// file makes its next write dirty its inode; `nlink` and `len` do
    /// not. Where the kernel has no multigrain timestamps there is
    /// nothing to check (said on stderr).
    #[test]
    fn looking_at_a_file_leaves_its_next_write_coarse() {
        let dir = tempfile::tempdir().unwrap();
        let f = File::create(dir.path().join("f")).unwrap();
        let rounds = 100;
        let stat = fine_second_writes(&f, rounds, |f| {
            f.metadata().unwrap();
        });
        if stat < rounds * 3 / 4 {
            eprintln!("no multigrain timestamps here ({stat} of {rounds}): nothing to check");
            return;
        }
        let by_nlink = fine_second_writes(&f, rounds, |f| {
            nlink(f).unwrap();
        });
        let by_len = fine_second_writes(&f, rounds, |f| {
            len(f).unwrap();
        });
        // Other tests' fine-grained times may move the floor now and then.
        assert!(
            by_nlink < rounds / 4,
            "nlink read the times: {by_nlink} of {rounds}"
        );
        assert!(
            by_len < rounds / 4,
            "len read the times: {by_len} of {rounds}"
        );
    }
}
