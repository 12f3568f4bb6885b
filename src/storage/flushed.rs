//! The flush mark `DN/FLUSHED`: a generation stamp below which every
//! replica of this datanode is known to be on its disk.
//!
//! Why. A file closed without an `fsync` is recorded finished while its
//! replicas' last bytes may still be in the page cache or the disk's
//! cache. A power cut can then tear one replica inside (some 4 KiB pages
//! reached the disk, others did not) while its siblings survived whole:
//! the file reads back right (a reader skips a replica whose checksums
//! fail), but the block counts a replica it does not have until somebody
//! happens to read that one. Nothing at mount could tell which replicas
//! to look at: reading every checksum of every replica costs R times the
//! data. Every byte a daemon writes lands in a block whose stamp that
//! daemon allocated (a new block, an append, a truncation and a recovery
//! all take a new one), stamps only grow, and a copy is synced before it
//! is recorded; so one number per datanode is enough. The mount checks
//! the replicas at or above it and moves it up once they are checked;
//! while the daemon runs it moves up after every sync of the datanodes
//! that follows a housekeeping round (see `fs::unflushed` and
//! `pipeline::flush_floor`).
//!
//! The file is written to a temporary name, synced, renamed into place
//! and the directory synced, so a crash leaves the old mark or the new.
//! A missing or unreadable mark is 0: every replica is checked once.

use super::at::Sub;
use super::error::StorageError;
use super::layout::Layout;

/// The mark's file name, beside `VERSION`.
pub const FILE_NAME: &str = "FLUSHED";

/// The mark of the datanode laid out as `l`, if it has one.
pub fn read(l: &Layout) -> Result<Option<u64>, StorageError> {
    let text = l.fds().dir(Sub::Root).read_text(FILE_NAME)?;
    // A torn or foreign file reads as no mark: the safe side.
    Ok(text.and_then(|t| t.trim().parse::<u64>().ok()))
}

/// Puts `gs` in place as the mark of the datanode laid out as `l`,
/// durably.
pub fn write(l: &Layout, gs: u64) -> Result<(), StorageError> {
    l.fds()
        .dir(Sub::Root)
        .replace_durably(FILE_NAME, format!("{gs}\n").as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::DnId;

    #[test]
    fn a_mark_is_read_back_and_a_missing_or_torn_one_is_none() {
        let d = tempfile::tempdir().unwrap();
        let l = Layout::open(DnId(0), d.path()).unwrap();
        assert_eq!(read(&l).unwrap(), None);
        write(&l, 4711).unwrap();
        assert_eq!(read(&l).unwrap(), Some(4711));
        write(&l, 5000).unwrap();
        assert_eq!(read(&l).unwrap(), Some(5000));
        std::fs::write(d.path().join(FILE_NAME), "50").unwrap();
        assert_eq!(read(&l).unwrap(), Some(50));
        std::fs::write(d.path().join(FILE_NAME), "5x\0").unwrap();
        assert_eq!(read(&l).unwrap(), None, "torn");
        let names: Vec<_> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.starts_with('.'))
            .collect();
        assert!(names.is_empty(), "temporary files left: {names:?}");
    }
}
