//! How far a datanode's flush mark (`storage::flushed`) may move while
//! writers run.
//!
//! The mark promises that every finalized replica of a lower stamp is on
//! its disk, so that after a crash only the replicas at or above it need
//! their checksums read (`fs::unflushed`). A replica finalized without a
//! sync (a close without `fsync`, a block filled) is on its disk only
//! after the next sync of its filesystem; so the mark moves up to a fresh
//! stamp only once such a sync has run after that stamp was taken, and
//! never past a replica whose finalizing was under way when it was taken
//! (its last writes may come after the sync). A block whose stamp is
//! already below the latest stamp taken (opened before it, finalized
//! after) cannot be left to the next sync: the mark may pass it at any
//! moment, so its replicas are synced before they are recorded. That
//! costs a sync only for a block open across a move, and lets a writer
//! that holds a file open for days (an elected leader's lease file) hold
//! nothing back.

use std::collections::BTreeMap;

use crate::sync::{Mutex, lock};

/// The stamps the next move of the flush marks must respect.
#[derive(Default)]
pub struct FlushFloor {
    st: Mutex<Floors>,
}

#[derive(Default)]
struct Floors {
    /// The stamp of the latest move: a block below it is synced when it
    /// is finalized.
    taken: u64,
    /// Stamps of replicas being finalized unsynced right now, with how
    /// many of each.
    finalizing: BTreeMap<u64, usize>,
    /// Whether a replica was finalized unsynced since the latest move
    /// or finished finalizing since (else a move would sync nothing of
    /// ours).
    dirty: bool,
}

/// What finalizing an unsynced replica of one stamp may do.
#[must_use]
pub enum Finalizing<'a> {
    /// Left to the next move's sync: while this lives, no move takes the
    /// mark past its stamp.
    Left(Entry<'a>),
    /// Below the latest stamp taken: the replicas must be synced before
    /// they are recorded.
    Behind,
}

/// A replica being finalized unsynced, holding the marks at or below its
/// stamp until its writes are done (dropped then).
pub struct Entry<'a> {
    floor: &'a FlushFloor,
    gs: u64,
}

impl Drop for Entry<'_> {
    fn drop(&mut self) {
        let mut st = lock(&self.floor.st);
        // Its writes are done: the next move syncs them.
        st.dirty = true;
        if let Some(n) = st.finalizing.get_mut(&self.gs) {
            *n -= 1;
            if *n == 0 {
                st.finalizing.remove(&self.gs);
            }
        }
    }
}

impl FlushFloor {
    /// Called before replicas of stamp `gs` are finalized without a sync.
    pub fn finalizing(&self, gs: u64) -> Finalizing<'_> {
        let mut st = lock(&self.st);
        if gs < st.taken {
            return Finalizing::Behind;
        }
        st.dirty = true;
        *st.finalizing.entry(gs).or_default() += 1;
        Finalizing::Left(Entry { floor: self, gs })
    }

    /// Whether a replica was finalized unsynced since the latest move, or
    /// finished finalizing since.
    pub fn dirty(&self) -> bool {
        lock(&self.st).dirty
    }

    /// Takes `stamp`, allocated just before, as the latest: returns the
    /// mark that a sync of every datanode started after this call makes
    /// true (`stamp`, or the lowest stamp still being finalized).
    pub fn take(&self, stamp: u64) -> u64 {
        let mut st = lock(&self.st);
        st.taken = st.taken.max(stamp);
        st.dirty = false;
        st.finalizing
            .keys()
            .next()
            .map_or(stamp, |&lowest| lowest.min(stamp))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replica_being_finalized_holds_the_mark_and_one_behind_the_stamp_taken_is_synced() {
        let f = FlushFloor::default();
        assert!(!f.dirty());
        let a = f.finalizing(100);
        assert!(matches!(a, Finalizing::Left(_)));
        assert!(f.dirty());
        assert_eq!(f.take(150), 100, "the mark stays at the finalizing replica");
        assert!(!f.dirty());
        // Opened before the stamp taken, finalized after it.
        assert!(matches!(f.finalizing(120), Finalizing::Behind));
        assert!(!f.dirty(), "a synced replica leaves nothing to sync");
        let b = f.finalizing(150);
        drop(a);
        assert!(f.dirty(), "its writes are done: the next move syncs them");
        assert_eq!(f.take(200), 150);
        drop(b);
        assert_eq!(f.take(250), 250);
        // Two replicas of one stamp: the mark waits for both.
        let (c, d) = (f.finalizing(300), f.finalizing(300));
        drop(c);
        assert_eq!(f.take(400), 300);
        drop(d);
        assert_eq!(f.take(500), 500);
    }
}
