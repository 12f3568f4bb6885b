//! The mount's write buffer (`write_buffer=`): one budget of packets in
//! flight shared by every output stream, so that memory stays bounded
//! however many files are written at once.
//!
//! Each stream may always have one packet in flight outside the budget
//! (so every stream makes progress whoever holds the budget: no deadlock);
//! every further packet in flight takes a [`Unit`] of the budget, given
//! back when the packet is acknowledged (or dropped). A stream that finds
//! the budget spent queues, FIFO, and its write waits (the reply comes
//! later, never on a request thread) until a unit is handed to it; it never
//! fails for want of one.

use std::collections::VecDeque;
use std::sync::Weak;

use crate::sync::{Arc, Mutex, lock};

/// A stream that queued for a unit (see [`Budget::take`]).
pub trait UnitWaiter: Send + Sync {
    /// The unit it queued for, handed over on the blocking pool.
    fn unit_granted(self: Arc<Self>, unit: Unit);
}

/// Packets in flight beyond each stream's first, across the mount.
pub struct Budget {
    units: usize,
    st: Mutex<State>,
    rt: tokio::runtime::Handle,
}

struct State {
    free: usize,
    /// Streams waiting for a unit, first come first served.
    waiters: VecDeque<Weak<dyn UnitWaiter>>,
    /// Most units out at once, and how often a stream had to wait.
    peak: usize,
    waits: u64,
}

/// A snapshot, for tests and the benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct BudgetStats {
    pub units: usize,
    pub used: usize,
    pub peak: usize,
    pub waits: u64,
    pub waiting: usize,
}

/// One packet's share of the budget; given back when dropped.
pub struct Unit {
    budget: Arc<Budget>,
}

impl Drop for Unit {
    fn drop(&mut self) {
        self.budget.give_back();
    }
}

impl std::fmt::Debug for Unit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Unit")
    }
}

impl Budget {
    /// A budget of `units` packets. Units handed to waiting streams are
    /// delivered on `rt`'s blocking pool (never on the thread that gave
    /// one back, which may hold another stream's lock).
    pub fn new(units: usize, rt: tokio::runtime::Handle) -> Arc<Budget> {
        Arc::new(Budget {
            units,
            st: Mutex::new(State {
                free: units,
                waiters: VecDeque::new(),
                peak: 0,
                waits: 0,
            }),
            rt,
        })
    }

    /// A unit for `stream`, if one is free and no stream waits before it;
    /// otherwise `stream` joins the queue and is handed a unit later
    /// (through [`UnitWaiter::unit_granted`]). The caller queues a
    /// stream at most once at a time.
    pub(crate) fn take(self: &Arc<Self>, stream: &Weak<dyn UnitWaiter>) -> Option<Unit> {
        let mut s = lock(&self.st);
        if s.free > 0 && s.waiters.is_empty() {
            s.free -= 1;
            s.peak = s.peak.max(self.units - s.free);
            return Some(Unit {
                budget: self.clone(),
            });
        }
        s.waits += 1;
        s.waiters.push_back(stream.clone());
        None
    }

    fn give_back(self: &Arc<Self>) {
        let mut s = lock(&self.st);
        while let Some(w) = s.waiters.pop_front() {
            // A stream gone meanwhile needs nothing.
            if let Some(stream) = w.upgrade() {
                drop(s);
                let unit = Unit {
                    budget: self.clone(),
                };
                self.rt.spawn_blocking(move || stream.unit_granted(unit));
                return;
            }
        }
        s.free += 1;
    }

    pub fn stats(&self) -> BudgetStats {
        let s = lock(&self.st);
        BudgetStats {
            units: self.units,
            used: self.units - s.free,
            peak: s.peak,
            waits: s.waits,
            waiting: s.waiters.len(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime")
    }

    /// A stream that is gone by the time a unit is handed over.
    struct Gone;
    impl UnitWaiter for Gone {
        fn unit_granted(self: Arc<Self>, _: Unit) {}
    }

    #[test]
    fn units_are_counted_given_back_on_drop_and_never_exceed_the_budget() {
        let rt = rt();
        let b = Budget::new(2, rt.handle().clone());
        let none: Weak<dyn UnitWaiter> = Weak::<Gone>::new();
        let u1 = b.take(&none).expect("first unit");
        let u2 = b.take(&none).expect("second unit");
        assert!(b.take(&none).is_none(), "a third unit out of two");
        let st = b.stats();
        assert_eq!((st.used, st.peak, st.waits, st.waiting), (2, 2, 1, 1));
        // The waiter is gone (a dead stream): the unit goes back to the pool.
        drop(u1);
        let st = b.stats();
        assert_eq!((st.used, st.waiting), (1, 0));
        drop(u2);
        assert_eq!(b.stats().used, 0);
        // Nobody jumps the queue: with a (dead) waiter queued, a free unit
        // is not taken by a newcomer until the queue is served.
        let u = b.take(&none).expect("unit");
        let _u = b.take(&none).expect("unit");
        assert!(b.take(&none).is_none());
        drop(u);
        assert!(
            b.take(&none).is_some(),
            "the dead waiter's unit is free again"
        );
    }
}
