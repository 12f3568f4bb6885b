//! Blocks whose replica files exist, or are about to, before the metadata
//! records them where they are: a new block between its replicas' creation
//! and the commit that records it (a one-step small file writes its
//! replicas into `finalized/` before its close is recorded), and a copy
//! (re-replication, balancing, recovery into a new block) between the copy
//! and the commit that lists it.
//!
//! Every sweep that deletes replica files the metadata does not list asks
//! here first, and then reads the metadata again: a writer registers
//! before it creates the first file and lets go only after its commit
//! returned (or failed), so a replica listed by the sweep is either still
//! registered or already recorded. This daemon's writers only: over a
//! shared namespace the sweeps also keep young files (see `fsck`).

use std::collections::HashMap;

use crate::sync::{Arc, Mutex, lock};

/// The blocks being written or copied in this daemon, with how many
/// writers hold each (a copy may run beside a write of the same block).
#[derive(Debug, Default)]
pub struct InFlight {
    held: Mutex<HashMap<u64, u32>>,
}

/// One writer's hold on a block; let go on drop.
#[must_use = "the block is in flight only while the hold lives"]
#[derive(Debug)]
pub struct Hold {
    set: Arc<InFlight>,
    block: u64,
}

impl InFlight {
    /// Registers `block` until the returned hold is dropped.
    pub fn hold(self: &Arc<Self>, block: u64) -> Hold {
        *lock(&self.held).entry(block).or_default() += 1;
        Hold {
            set: self.clone(),
            block,
        }
    }

    /// Whether a writer of this daemon holds `block` now.
    pub fn contains(&self, block: u64) -> bool {
        lock(&self.held).contains_key(&block)
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        let mut held = lock(&self.set.held);
        if let Some(n) = held.get_mut(&self.block) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.block);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_stays_in_flight_until_its_last_hold_is_dropped() {
        let set = Arc::new(InFlight::default());
        let a = set.hold(7);
        let b = set.hold(7);
        assert!(set.contains(7) && !set.contains(8));
        drop(a);
        assert!(set.contains(7));
        drop(b);
        assert!(!set.contains(7));
    }
}
