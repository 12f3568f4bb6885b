//! Injected time. Lease expiry, renewal and monitor ticks read time only
//! through [`Clock`], so tests drive minutes of lease life in microseconds
//! with [`FakeClock`] instead of sleeping.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A monotonic clock plus the wall clock used only for display and audit.
pub trait Clock: Send + Sync + 'static {
    /// Monotonic time since an arbitrary origin; never goes backwards.
    fn now(&self) -> Duration;
    /// Milliseconds since the Unix epoch, for records humans read.
    fn wall_ms(&self) -> u64;
}

/// The real clock.
#[derive(Debug)]
pub struct SystemClock {
    origin: Instant,
}

impl SystemClock {
    pub fn new() -> Self {
        SystemClock {
            origin: Instant::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Duration {
        self.origin.elapsed()
    }
    fn wall_ms(&self) -> u64 {
        wall_ms()
    }
}

/// The boot clock (`CLOCK_BOOTTIME`): monotonic, and unlike [`Instant`]
/// it counts the time the machine was suspended, so a deadline kept on it
/// is seen as passed as soon as the machine wakes up.
#[derive(Debug, Default)]
pub struct BootClock;

impl Clock for BootClock {
    fn now(&self) -> Duration {
        nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)
            .map(Duration::from)
            .unwrap_or_default()
    }
    fn wall_ms(&self) -> u64 {
        wall_ms()
    }
}

/// A point on the boot clock: an [`Instant`] that counts a suspend. Over
/// etcd a claim's deadline is kept on it, because etcd's TTL runs on while
/// this machine sleeps: a daemon that wakes past a deadline gives its
/// claims up at its next keep-alive round instead of trusting them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct BootInstant(Duration);

impl BootInstant {
    pub fn now() -> BootInstant {
        BootInstant(BootClock.now())
    }

    pub fn elapsed(&self) -> Duration {
        Self::now().saturating_duration_since(*self)
    }

    pub fn saturating_duration_since(&self, earlier: BootInstant) -> Duration {
        self.0.saturating_sub(earlier.0)
    }
}

impl std::ops::Add<Duration> for BootInstant {
    type Output = BootInstant;
    fn add(self, d: Duration) -> BootInstant {
        BootInstant(self.0 + d)
    }
}

/// Milliseconds since the Unix epoch from the system clock.
pub fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A clock that only moves when a test says so.
#[derive(Debug, Default)]
pub struct FakeClock {
    nanos: AtomicU64,
}

impl FakeClock {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn advance(&self, by: Duration) {
        self.nanos.fetch_add(by.as_nanos() as u64, Ordering::SeqCst);
    }
}

impl Clock for FakeClock {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.nanos.load(Ordering::SeqCst))
    }
    fn wall_ms(&self) -> u64 {
        1_700_000_000_000 + self.now().as_millis() as u64
    }
}
