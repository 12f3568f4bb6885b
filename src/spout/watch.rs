//! What the spout's blocking steps keep an eye on: the run's stop request
//! and the consumer's progress (docs/SEMANTICS.md "Spout", *Progress and
//! stopping*).
//!
//! A consumer makes progress when it takes records or acknowledges them;
//! one that does neither for the progress timeout is stalled: the renewal
//! thread stops renewing the leases of its file (renewal depends on
//! progress, as Storm's lock heartbeat depends on acknowledgements), and an
//! `--exec` command is killed, whole process tree, so that its file goes to
//! another instance instead of being pinned forever. The stop request is a
//! copy of the caller's flag that the emitter's own waits can read.
//!
//! Times are on the boot clock (`CLOCK_BOOTTIME`): a machine suspended
//! past the timeout finds it passed when it wakes up.

use std::time::Duration;

use crate::clock::{BootClock, Clock};
use crate::sync::{Arc, AtomicBool, AtomicU64, Ordering};

#[derive(Debug)]
struct Inner {
    /// Boot-clock milliseconds of the last progress.
    last_ms: AtomicU64,
    /// 0: no progress timeout.
    timeout_ms: u64,
    stop: AtomicBool,
}

/// Shared between the run loop, the emitter and the renewal thread;
/// cloning shares it.
#[derive(Debug, Clone)]
pub struct Watch {
    inner: Arc<Inner>,
}

fn now_ms() -> u64 {
    BootClock.now().as_millis() as u64
}

impl Watch {
    /// A watch with a progress timeout (`None`: a consumer may take as long
    /// as it likes), counting from now.
    pub fn new(timeout: Option<Duration>) -> Watch {
        Watch {
            inner: Arc::new(Inner {
                last_ms: AtomicU64::new(now_ms()),
                timeout_ms: timeout.map_or(0, |t| (t.as_millis() as u64).max(1)),
                stop: AtomicBool::new(false),
            }),
        }
    }

    /// The consumer made progress now.
    pub fn beat(&self) {
        self.inner.last_ms.fetch_max(now_ms(), Ordering::SeqCst);
    }

    /// How long since the last progress.
    pub fn quiet_for(&self) -> Duration {
        Duration::from_millis(now_ms().saturating_sub(self.inner.last_ms.load(Ordering::SeqCst)))
    }

    pub fn timeout(&self) -> Option<Duration> {
        (self.inner.timeout_ms > 0).then(|| Duration::from_millis(self.inner.timeout_ms))
    }

    /// No progress for longer than the progress timeout.
    pub fn stalled(&self) -> bool {
        self.timeout().is_some_and(|t| self.quiet_for() > t)
    }

    pub fn request_stop(&self) {
        self.inner.stop.store(true, Ordering::SeqCst);
    }

    pub fn stop_requested(&self) -> bool {
        self.inner.stop.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stalled_only_after_the_timeout_without_beats() {
        let w = Watch::new(Some(Duration::from_millis(50)));
        assert!(!w.stalled());
        std::thread::sleep(Duration::from_millis(80));
        assert!(w.stalled());
        w.beat();
        assert!(!w.stalled());
        let none = Watch::new(None);
        std::thread::sleep(Duration::from_millis(10));
        assert!(!none.stalled());
    }
}
