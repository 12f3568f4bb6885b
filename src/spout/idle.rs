//! When a lock file (or DIRLOCK) counts as idle, in Storm's two ways
//! (`hdfsspout.clocks.insync`):
//!
//! - **clocks in sync** (the default, as in Storm): idle once both its
//!   modification time and its last entry's timestamp are at least the
//!   lock timeout older than this host's wall clock. Cheap, and right at
//!   once after a restart, but a lock dated in the future (a writer's clock
//!   ahead, a clock stepped back here) is not idle until that future has
//!   come and gone.
//! - **observed** (`--clocks-insync false`): idle once this instance saw it
//!   unchanged (same inode, size, modification and change times) for the
//!   lock timeout of its own monotonic clock. No wall clock is compared, so
//!   no clock skew or jump matters; the price is that an instance must
//!   watch a lock for the lock timeout before it may take it, even one
//!   that was idle long before it started.
//!
//! Either way idleness only allows a takeover to be *tried*: it succeeds
//! only once the owner's lease is gone (see [`super::lock`]).

use std::collections::HashMap;
use std::fs::Metadata;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::entry::LogEntry;
use crate::clock::{BootClock, Clock};

/// What a lock file looks like from outside: every write changes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Look {
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Look {
    pub fn of(m: &Metadata) -> Look {
        Look {
            ino: m.ino(),
            len: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        }
    }
}

/// What this instance saw of each lock file, and since when (boot clock).
#[derive(Debug, Default)]
pub struct Observer {
    seen: HashMap<PathBuf, (Look, Duration)>,
}

impl Observer {
    /// Notes `path` as it looks now: its unchanged time restarts when it
    /// changed since the last look.
    pub fn observe(&mut self, path: &Path, m: &Metadata) {
        let look = Look::of(m);
        let now = BootClock.now();
        match self.seen.get_mut(path) {
            Some((l, _)) if *l == look => {}
            Some(e) => *e = (look, now),
            None => {
                self.seen.insert(path.to_path_buf(), (look, now));
            }
        }
    }

    /// Forgets the files that are gone (so memory follows the directory).
    pub fn keep_only(&mut self, present: &[PathBuf]) {
        self.seen.retain(|p, _| present.contains(p));
    }

    /// For how long `path` was seen looking as `m` says, without a change.
    pub fn unchanged_for(&self, path: &Path, m: &Metadata) -> Duration {
        match self.seen.get(path) {
            Some((l, since)) if *l == Look::of(m) => BootClock.now().saturating_sub(*since),
            _ => Duration::ZERO,
        }
    }
}

/// How idleness is decided for one look at the lock directory.
#[derive(Debug, Clone, Copy)]
pub enum Judge<'a> {
    /// Storm's `clocks.insync=true`: against this wall clock reading.
    Clocks { now_ms: u64, timeout: Duration },
    /// Storm's `clocks.insync=false`: by what `observer` saw.
    Observed {
        observer: &'a Observer,
        timeout: Duration,
    },
}

/// Milliseconds since the Unix epoch of a file's modification time.
pub fn mtime_ms(meta: &Metadata) -> u64 {
    (meta.mtime().max(0) as u64) * 1000 + (meta.mtime_nsec().max(0) as u64) / 1_000_000
}

/// Storm's rule for an idle lock: modified no later than `now - timeout`.
pub fn idle_by_clock(time_ms: u64, now_ms: u64, timeout: Duration) -> bool {
    time_ms <= now_ms.saturating_sub(timeout.as_millis() as u64)
}

impl Judge<'_> {
    /// Whether the file at `path`, as `m` says it is, is idle.
    pub fn idle(&self, path: &Path, m: &Metadata) -> bool {
        match self {
            Judge::Clocks { now_ms, timeout } => idle_by_clock(mtime_ms(m), *now_ms, *timeout),
            Judge::Observed { observer, timeout } => observer.unchanged_for(path, m) >= *timeout,
        }
    }

    /// Whether a lock's last entry is idle too: by its timestamp with
    /// clocks in sync; observed, the file's look already covers it.
    pub fn entry_idle(&self, e: &LogEntry) -> bool {
        match self {
            Judge::Clocks { now_ms, timeout } => idle_by_clock(e.time_ms, *now_ms, *timeout),
            Judge::Observed { .. } => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_is_storms_at_or_before() {
        let t = Duration::from_secs(3);
        assert!(idle_by_clock(7_000, 10_000, t));
        assert!(!idle_by_clock(7_001, 10_000, t));
        // Shortly after the epoch (a fake clock) nothing underflows.
        assert!(idle_by_clock(0, 1_000, t));
    }

    #[test]
    fn observed_idleness_ignores_timestamps_and_restarts_on_change() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("lock");
        // Dated a day ahead: with clocks in sync this is never idle.
        let ahead = crate::clock::wall_ms() + 86_400_000;
        std::fs::write(&p, format!("{ahead},other,0")).unwrap();
        let m = std::fs::metadata(&p).unwrap();
        let t = Duration::from_millis(100);
        let mut o = Observer::default();
        o.observe(&p, &m);
        let judge = |o: &Observer, m: &Metadata| {
            Judge::Observed {
                observer: o,
                timeout: t,
            }
            .idle(&p, m)
        };
        assert!(!judge(&o, &m));
        std::thread::sleep(Duration::from_millis(150));
        o.observe(&p, &m);
        assert!(judge(&o, &m));
        let e = LogEntry::parse(&format!("{ahead},other,0")).unwrap();
        assert!(
            !Judge::Clocks {
                now_ms: crate::clock::wall_ms(),
                timeout: t
            }
            .entry_idle(&e)
        );
        // A change restarts the wait.
        std::fs::write(&p, format!("{ahead},other,0\n{ahead},other,0")).unwrap();
        let m2 = std::fs::metadata(&p).unwrap();
        o.observe(&p, &m2);
        assert!(!judge(&o, &m2));
    }
}
