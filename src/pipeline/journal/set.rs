//! [`Journal`]: which journaled blocks wait for a checkpoint, and which
//! no checkpoint could sync (the state `pipeline::journal` keeps; no I/O
//! here, so the streams' context can hold it).

use std::collections::HashSet;
use std::time::Duration;

use crate::meta::Meta;
use crate::sync::{AtomicBool, Condvar, Mutex, Ordering, lock};

/// How long a checkpoint waits for more blocks to share its syncs, by
/// default (`-o journal_checkpoint`). Not a matter of durability (the
/// rows are): 10, 50, 250 and 1,000 ms gave the same small-file rates
/// within noise (benches/PROFILE.md), the longer ones a little better at
/// R=3 (fewer `syncfs` beside the WAL's syncs).
pub const CHECKPOINT_AFTER: Duration = Duration::from_millis(200);

/// Blocks journaled and not yet checkpointed at most: past it an fsync
/// syncs its replicas itself (the journal's rows are the WAL's bytes, and
/// a checkpoint that lags must not let them grow without bound).
const MAX_PENDING: usize = 1024;

/// Blocks whose rows are in the store and whose replicas are not known
/// synced (by id: a checkpoint reads their rows afresh, since a replica
/// list may have changed meanwhile).
pub struct Journal {
    /// Off: every fsync syncs its replicas itself (`journal_checkpoint=0`,
    /// tests of that path).
    enabled: AtomicBool,
    /// How long after its first block a checkpoint runs.
    pub(super) after: Duration,
    pub(super) pending: Mutex<HashSet<u64>>,
    /// Blocks none of whose replicas could be synced: their rows stay for
    /// the next mount's replay, and nothing may change them in place.
    pub(super) stuck: Mutex<HashSet<u64>>,
    pub(super) scheduled: AtomicBool,
    /// Held by a checkpoint from the moment it reads its blocks' rows to
    /// the moment it forgets them, and by [`super::settle`]: a block that
    /// an append or a truncation settles is not being synced under its
    /// old stamp by a checkpoint when its stamp changes (a per-file sync
    /// would then find a newer replica and fail it).
    pub(super) running: Mutex<()>,
    /// Set at unmount: a scheduled checkpoint stops waiting for more
    /// blocks. Its wait holds a pool thread, and the runtime's end waits
    /// for every such thread: with a long `journal_checkpoint` the daemon
    /// would outlive its unmount by up to that long, holding the data
    /// directory that a new mount needs.
    stopping: Mutex<bool>,
    stopped: Condvar,
    /// Unit tests: scheduled checkpoints do nothing (the test runs them).
    #[cfg(test)]
    pub(super) held: AtomicBool,
}

impl Default for Journal {
    fn default() -> Self {
        Journal::new(CHECKPOINT_AFTER)
    }
}

impl Journal {
    /// A journal whose checkpoints run `after` their first block (zero:
    /// no journal).
    pub fn new(after: Duration) -> Journal {
        Journal {
            enabled: AtomicBool::new(!after.is_zero()),
            after,
            pending: Mutex::default(),
            stuck: Mutex::default(),
            scheduled: AtomicBool::new(false),
            running: Mutex::new(()),
            stopping: Mutex::new(false),
            stopped: Condvar::new(),
            #[cfg(test)]
            held: AtomicBool::new(false),
        }
    }

    /// Unit tests: turns the journal on or off for fsyncs from now on.
    #[cfg(test)]
    pub(crate) fn set_enabled(&self, on: bool) {
        self.enabled.store(on, Ordering::Release);
    }

    /// Whether an fsync of a small block written whole may be made durable
    /// through the journal now.
    pub(crate) fn takes(&self, meta: &dyn Meta) -> bool {
        self.enabled.load(Ordering::Acquire)
            && meta.journals()
            && lock(&self.pending).len() < MAX_PENDING
    }

    /// Block `id` waits for a checkpoint; whether one must be scheduled.
    pub(super) fn note(&self, id: u64) -> bool {
        lock(&self.pending).insert(id);
        !self.scheduled.swap(true, Ordering::AcqRel)
    }

    /// Waits the checkpoint's window, or until [`Self::stop`].
    pub(super) fn wait_window(&self) {
        let stopping = lock(&self.stopping);
        let _ = self
            .stopped
            .wait_timeout_while(stopping, self.after, |stop| !*stop);
    }

    /// Unmounting: scheduled checkpoints run now (the unmount's own
    /// checkpoint syncs what they would have).
    pub fn stop(&self) {
        *lock(&self.stopping) = true;
        self.stopped.notify_all();
    }

    /// Unit tests: checkpoints run only when the test calls them.
    #[cfg(test)]
    pub(crate) fn hold_checkpoints(&self) {
        self.held.store(true, Ordering::Release);
    }

    /// Blocks the replay at mount kept in the journal: nothing may change
    /// them in place until the next mount replays them again.
    pub fn keep(&self, ids: &[u64]) {
        lock(&self.stuck).extend(ids.iter().copied());
    }

    /// Unit tests: blocks waiting for a checkpoint.
    #[cfg(test)]
    pub(crate) fn pending(&self) -> usize {
        lock(&self.pending).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::Arc;
    use std::time::Instant;

    #[test]
    fn a_stop_ends_the_window_of_a_checkpoint_waiting_and_of_those_to_come() {
        let j = Arc::new(Journal::new(Duration::from_secs(600)));
        let waiting = {
            let j = Arc::clone(&j);
            std::thread::spawn(move || j.wait_window())
        };
        std::thread::sleep(Duration::from_millis(50));
        let t = Instant::now();
        j.stop();
        waiting.join().unwrap();
        j.wait_window();
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    }
}
