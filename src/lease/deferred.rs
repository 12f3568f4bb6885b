//! Work the lease manager collects under its lock and does after it.

use super::types::{Grant, GrantCallback, LeaseError};

/// Callbacks to call, and callbacks to drop unused, once the lock is
/// released: neither a reply nor a destructor ever runs under the lock.
#[derive(Default)]
pub(super) struct Deferred {
    calls: Vec<(GrantCallback, Result<Grant, LeaseError>)>,
    drops: Vec<GrantCallback>,
}

impl Deferred {
    pub(super) fn call(&mut self, cb: GrantCallback, res: Result<Grant, LeaseError>) {
        self.calls.push((cb, res));
    }

    pub(super) fn discard(&mut self, cb: GrantCallback) {
        self.drops.push(cb);
    }

    pub(super) fn run(self) {
        drop(self.drops);
        for (cb, res) in self.calls {
            cb(res);
        }
    }
}
