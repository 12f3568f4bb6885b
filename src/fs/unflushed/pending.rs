//! Where the flush marks stand: the mount's checks they wait for, their
//! moves, or stuck (kept apart so that `Core` can hold it without
//! depending on the code that drives it).

use std::collections::HashSet;

use crate::meta::DnId;

/// Where the flush marks stand in this daemon's life.
#[derive(Debug, Default)]
pub(crate) enum Marks {
    /// Nothing to do: over a shared namespace, or before the mount's
    /// check (which sets the state).
    #[default]
    Off,
    /// Waiting for the checks the mount gave housekeeping.
    Checking(Unflushed),
    /// Moved after each housekeeping round in which anything was written;
    /// `last` is the stamp the latest move took.
    Moving { last: u64 },
    /// A sync the marks rely on failed: they stay where they are for this
    /// daemon's lifetime (a later sync would find the failed pages clean).
    Stuck,
}

/// The checks a mount gave housekeeping, and the mark that follows them.
#[derive(Debug)]
pub(crate) struct Unflushed {
    /// Allocated after the mount synced the datanodes: every replica of a
    /// lower stamp is on its disk once the suspects below are checked.
    gs: u64,
    /// Replicas at or above the old mark not yet checked.
    waiting: HashSet<(u64, DnId)>,
}

impl Unflushed {
    pub(crate) fn new(gs: u64, waiting: HashSet<(u64, DnId)>) -> Self {
        Unflushed { gs, waiting }
    }

    /// Forgets the replicas no longer `suspect` (checked); once none is
    /// left, the stamp the marks may move up to.
    pub(crate) fn checked(&mut self, suspect: &[(u64, DnId)]) -> Option<u64> {
        let still: HashSet<&(u64, DnId)> = suspect.iter().collect();
        self.waiting.retain(|s| still.contains(s));
        self.waiting.is_empty().then_some(self.gs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_marks_move_only_once_every_reported_replica_was_checked() {
        let waiting: HashSet<_> = [(7, DnId(0)), (7, DnId(1)), (9, DnId(2))].into();
        let mut u = Unflushed::new(500, waiting);
        assert_eq!(u.checked(&[(7, DnId(1)), (9, DnId(2))]), None);
        // Reported by a reader meanwhile: no replica of the mount's.
        assert_eq!(u.checked(&[(9, DnId(2)), (3, DnId(0))]), None);
        assert_eq!(u.checked(&[(3, DnId(0))]), Some(500));
    }
}
