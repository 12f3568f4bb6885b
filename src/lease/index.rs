//! Files ordered by a point in time, so that the monitor's tick visits only
//! the files whose time has come and never scans healthy leases.

use std::collections::BTreeSet;

use super::types::FileId;

/// Marks "not in the index" in a lease's key slot. A deadline that saturates
/// to this value is never reached, which is what it means anyway.
pub(crate) const UNSET: u64 = u64::MAX;

/// A set of `(time, file)` keys. Every lease keeps its current key in a slot
/// of its own (`UNSET` when absent), so an update removes exactly the old key:
/// the index never holds stale entries and needs no compaction.
#[derive(Debug, Default)]
pub(crate) struct TimeIndex {
    keys: BTreeSet<(u64, FileId)>,
}

impl TimeIndex {
    /// Puts `file` at `at` (or takes it out for `None`), keeping `slot`, the
    /// lease's record of its key, in step. O(log n); free when unchanged.
    pub(crate) fn set(&mut self, file: FileId, slot: &mut u64, at: Option<u64>) {
        let at = at.unwrap_or(UNSET);
        if *slot == at {
            return;
        }
        if *slot != UNSET {
            self.keys.remove(&(*slot, file));
        }
        if at != UNSET {
            self.keys.insert((at, file));
        }
        *slot = at;
    }

    /// Takes out the earliest file whose key is at or before `t`. The caller
    /// must reset that file's slot to `UNSET`.
    pub(crate) fn pop_through(&mut self, t: u64) -> Option<FileId> {
        match self.keys.first() {
            Some(&(at, _)) if at <= t => self.keys.pop_first().map(|(_, file)| file),
            _ => None,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.keys.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_moves_and_removes_exactly_one_key() {
        let mut idx = TimeIndex::default();
        let (mut a, mut b) = (UNSET, UNSET);
        idx.set(1, &mut a, Some(10));
        idx.set(2, &mut b, Some(5));
        idx.set(1, &mut a, Some(3));
        assert_eq!(idx.len(), 2);
        assert_eq!(idx.pop_through(4), Some(1));
        assert_eq!(idx.pop_through(4), None);
        idx.set(2, &mut b, None);
        assert_eq!(idx.len(), 0);
        assert_eq!(b, UNSET);
    }
}
