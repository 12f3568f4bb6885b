//! How many write opens of one user may be under way in the daemon at
//! once. An open that waits for a lease (`lease_wait`, the reopen grace,
//! a queue across daemons) keeps its FUSE request unanswered, and over
//! io_uring an unanswered request keeps its ring entry: a ring has at most
//! 1,024, one per CPU, so one user's thousand waiting opens on one CPU
//! would leave every other user's requests on that CPU waiting for an
//! entry. Past the bounds an open no longer waits: it is answered at once,
//! as with `O_NONBLOCK` (`EBUSY` when the file is held). Root is not
//! bounded: it can stop the daemon anyway.

use std::collections::HashMap;

use crate::sync::{Arc, Mutex, lock};

/// Write opens one user may have under way before the next one does not
/// wait. Far above what a program opens at once, far below a ring.
pub const PER_USER: usize = 64;
/// Write opens under way, all users but root, before none waits: half a
/// ring, so that whatever users do, most entries stay free.
pub const TOTAL: usize = 512;

#[derive(Default)]
pub struct Waits {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    by_user: HashMap<u32, usize>,
    total: usize,
}

/// One open under way; counted until dropped (with the open's reply).
pub struct Permit {
    waits: Option<Arc<Waits>>,
    uid: u32,
    may_wait: bool,
}

impl Waits {
    /// Counts an open of `uid` in; whether it may wait is
    /// [`Permit::may_wait`].
    pub fn enter(self: &Arc<Self>, uid: u32) -> Permit {
        if uid == 0 {
            return Permit {
                waits: None,
                uid,
                may_wait: true,
            };
        }
        let mut g = lock(&self.inner);
        let mine = g.by_user.entry(uid).or_default();
        *mine += 1;
        let may_wait = *mine <= PER_USER;
        g.total += 1;
        let may_wait = may_wait && g.total <= TOTAL;
        if !may_wait {
            tracing::debug!(
                uid,
                "too many write opens under way: this one does not wait"
            );
        }
        Permit {
            waits: Some(self.clone()),
            uid,
            may_wait,
        }
    }

    /// Opens of `uid` under way.
    #[cfg(test)]
    pub fn of(&self, uid: u32) -> usize {
        lock(&self.inner).by_user.get(&uid).copied().unwrap_or(0)
    }
}

impl Permit {
    pub fn may_wait(&self) -> bool {
        self.may_wait
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let Some(w) = &self.waits else { return };
        let mut g = lock(&w.inner);
        g.total = g.total.saturating_sub(1);
        if let Some(n) = g.by_user.get_mut(&self.uid) {
            *n -= 1;
            if *n == 0 {
                g.by_user.remove(&self.uid);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_user_past_the_bound_does_not_wait_and_others_still_do() {
        let w = Arc::new(Waits::default());
        let mine: Vec<Permit> = (0..PER_USER).map(|_| w.enter(1000)).collect();
        assert!(mine.iter().all(Permit::may_wait));
        assert!(!w.enter(1000).may_wait(), "past the bound");
        assert!(w.enter(1001).may_wait(), "another user");
        assert!(w.enter(0).may_wait(), "root");
        drop(mine);
        assert_eq!(w.of(1000), 0);
        assert!(w.enter(1000).may_wait());
    }

    #[test]
    fn past_the_total_nobody_but_root_waits() {
        let w = Arc::new(Waits::default());
        let all: Vec<Permit> = (0..TOTAL)
            .map(|i| w.enter(1000 + (i / PER_USER) as u32))
            .collect();
        assert!(all.iter().all(Permit::may_wait));
        assert!(!w.enter(5000).may_wait());
        assert!(w.enter(0).may_wait());
    }
}
