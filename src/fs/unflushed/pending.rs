//! The state between a mount's report of replicas to check and the move
//! of the flush marks (kept apart so that `Core` can hold it without
//! depending on the code that drives it).

use std::collections::HashSet;

use crate::meta::DnId;

/// The checks a mount gave housekeeping, and the mark that follows them.
#[derive(Debug)]
pub(crate) struct Unflushed {
    /// Allocated after the mount synced the datanodes: every replica of a
    /// lower stamp is on its disk once the suspects below are checked.
    gs: u64,
    /// Replicas at or above the old mark not yet checked.
    waiting: HashSet<(u64, DnId)>,
    /// Whether every sync of the mount succeeded: if not, the marks stay
    /// where they are for this daemon's lifetime.
    synced: bool,
}

impl Unflushed {
    pub(crate) fn new(gs: u64, waiting: HashSet<(u64, DnId)>, synced: bool) -> Self {
        Unflushed {
            gs,
            waiting,
            synced,
        }
    }

    /// Forgets the replicas no longer `suspect` (checked); once none is
    /// left, and the mount's syncs all succeeded, the stamp the marks may
    /// move up to.
    pub(crate) fn checked(&mut self, suspect: &[(u64, DnId)]) -> Option<u64> {
        if !self.synced {
            return None;
        }
        let still: HashSet<&(u64, DnId)> = suspect.iter().collect();
        self.waiting.retain(|s| still.contains(s));
        self.waiting.is_empty().then_some(self.gs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_marks_move_only_once_every_reported_replica_was_checked_and_synced() {
        let waiting: HashSet<_> = [(7, DnId(0)), (7, DnId(1)), (9, DnId(2))].into();
        let mut u = Unflushed::new(500, waiting.clone(), true);
        assert_eq!(u.checked(&[(7, DnId(1)), (9, DnId(2))]), None);
        // Reported by a reader meanwhile: no replica of the mount's.
        assert_eq!(u.checked(&[(9, DnId(2)), (3, DnId(0))]), None);
        assert_eq!(u.checked(&[(3, DnId(0))]), Some(500));
        let mut failed = Unflushed::new(500, waiting, false);
        assert_eq!(failed.checked(&[]), None, "a sync at mount failed");
    }
}
