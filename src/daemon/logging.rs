//! The daemon's log (`DATA/leasefs.log`; `RUST_LOG` sets the level),
//! bounded whatever users do (docs/SEMANTICS.md, "Threat model"):
//!
//! - **Per user.** A line that a user's request causes (a refused write,
//!   a queued open, an interrupted wait, a control request) carries that
//!   user's `uid` as a field. Each user gets a budget of such lines: a
//!   burst of [`BURST`], then [`PER_SEC`] a second; lines over it are
//!   counted, not written, and [`report_suppressed`] (the lease monitor's
//!   tick) writes one line per user saying how many were left out. The
//!   daemon's own lines (no `uid`) are never held back.
//! - **In size.** When the daemon's standard error is `DATA/leasefs.log`
//!   (a mount without `-f` starts it so), the file is rotated once it
//!   passes `log_size` (default 16 MiB): `leasefs.log` becomes
//!   `leasefs.log.1`, older ones move up to `.3`, and the oldest goes.
//!   The new file is put on the daemon's standard output and error too, so
//!   that a panic's message lands in it. With `-f` the log goes wherever
//!   standard error goes, unrotated: that is the caller's to keep.

use std::collections::HashMap;
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Instant;

use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;

use crate::sync::{AtomicU64, Mutex, Ordering, lock};

/// Lines of one user written at once before the rate applies.
pub const BURST: f64 = 50.0;
/// Lines of one user written per second beyond the burst.
pub const PER_SEC: f64 = 5.0;
/// Rotated files kept beside the current one (`leasefs.log.1` ..).
pub const KEEP: usize = 3;

/// One user's budget of log lines.
struct Bucket {
    tokens: f64,
    at: Instant,
    suppressed: u64,
}

/// The budgets of the users whose requests were logged lately.
#[derive(Default)]
struct Budgets {
    users: Mutex<HashMap<u32, Bucket>>,
}

impl Budgets {
    /// Whether a line of `uid` may be written now.
    fn take(&self, uid: u32, now: Instant) -> bool {
        let mut m = lock(&self.users);
        let b = m.entry(uid).or_insert(Bucket {
            tokens: BURST,
            at: now,
            suppressed: 0,
        });
        let dt = now.saturating_duration_since(b.at).as_secs_f64();
        b.tokens = (b.tokens + dt * PER_SEC).min(BURST);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            true
        } else {
            b.suppressed += 1;
            false
        }
    }

    /// The users with lines left out since the last call, and how many;
    /// users whose budget is full again are forgotten.
    fn drain(&self, now: Instant) -> Vec<(u32, u64)> {
        let mut m = lock(&self.users);
        let out: Vec<(u32, u64)> = m
            .iter_mut()
            .filter(|(_, b)| b.suppressed > 0)
            .map(|(u, b)| (*u, std::mem::take(&mut b.suppressed)))
            .collect();
        m.retain(|_, b| {
            let dt = now.saturating_duration_since(b.at).as_secs_f64();
            b.tokens + dt * PER_SEC < BURST
        });
        out
    }
}

fn budgets() -> &'static Budgets {
    static B: OnceLock<Budgets> = OnceLock::new();
    B.get_or_init(Budgets::default)
}

/// Finds the `uid` field of an event.
struct UidOf(Option<u32>);

impl Visit for UidOf {
    fn record_u64(&mut self, f: &Field, v: u64) {
        if f.name() == "uid" {
            self.0 = u32::try_from(v).ok();
        }
    }
    fn record_i64(&mut self, f: &Field, v: i64) {
        if f.name() == "uid" {
            self.0 = u32::try_from(v).ok();
        }
    }
    fn record_debug(&mut self, _: &Field, _: &dyn std::fmt::Debug) {}
}

/// The layer that holds back a user's lines over their budget.
struct PerUser;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for PerUser {
    fn event_enabled(&self, event: &tracing::Event<'_>, _: Context<'_, S>) -> bool {
        let mut v = UidOf(None);
        event.record(&mut v);
        match v.0 {
            None => true,
            Some(uid) => budgets().take(uid, Instant::now()),
        }
    }
}

/// Writes one line per user whose lines were left out since the last
/// call (called from the lease monitor's tick).
pub fn report_suppressed() {
    for (user, lines) in budgets().drain(Instant::now()) {
        tracing::warn!(
            user,
            lines,
            "log lines caused by this user's requests left out (more than {PER_SEC} a second)"
        );
    }
}

/// The daemon's standard error when it is the data directory's log: what
/// is written there is counted, and the file rotated past its size.
struct Rotating {
    path: PathBuf,
    max: u64,
    written: AtomicU64,
    rotating: Mutex<()>,
}

impl Rotating {
    /// Rotation of `data`'s log when standard error is that file.
    fn of(data: &Path, max: u64) -> Option<Rotating> {
        let path = data.join("leasefs.log");
        let on_disk = std::fs::metadata(&path).ok()?;
        let stderr = nix::sys::stat::fstat(io::stderr()).ok()?;
        let same = on_disk.dev() == stderr.st_dev as u64 && on_disk.ino() == stderr.st_ino as u64;
        (same && max > 0).then(|| Rotating {
            path,
            max,
            written: AtomicU64::new(on_disk.len()),
            rotating: Mutex::new(()),
        })
    }

    /// Moves the full log aside and puts a fresh one on standard output
    /// and error. Errors are reported on the log itself (the old one when
    /// the new one cannot be made).
    fn rotate(&self) {
        let _one = lock(&self.rotating);
        if self.written.load(Ordering::Relaxed) < self.max {
            return;
        }
        let name = |i: usize| PathBuf::from(format!("{}.{i}", self.path.display()));
        for i in (1..KEEP).rev() {
            let _ = std::fs::rename(name(i), name(i + 1));
        }
        let fresh = std::fs::rename(&self.path, name(1)).and_then(|()| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o644)
                .open(&self.path)
        });
        match fresh {
            Ok(f) => {
                for target in [libc::STDOUT_FILENO, libc::STDERR_FILENO] {
                    // SAFETY: dup2 of a descriptor we own onto the standard
                    // ones, which stay open throughout (dup2 replaces
                    // atomically); `f` is closed after.
                    unsafe { libc::dup2(f.as_raw_fd(), target) };
                }
                self.written.store(0, Ordering::Relaxed);
            }
            Err(e) => {
                // Try again only after another full log's worth.
                self.written.store(0, Ordering::Relaxed);
                let _ = writeln!(io::stderr(), "leasefs: cannot rotate the log: {e}");
            }
        }
    }
}

/// A writer of one log line.
struct LineWriter<'a>(Option<&'a Rotating>);

impl Write for LineWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = io::stderr().write(buf)?;
        if let Some(r) = self.0
            && r.written.fetch_add(n as u64, Ordering::Relaxed) + n as u64 >= r.max
        {
            r.rotate();
        }
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        io::stderr().flush()
    }
}

/// What the log lines are written through.
struct Sink(Option<Rotating>);

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Sink {
    type Writer = LineWriter<'a>;
    fn make_writer(&'a self) -> LineWriter<'a> {
        LineWriter(self.0.as_ref())
    }
}

/// Sets up the daemon's logging: `RUST_LOG` (default `info`), each user's
/// lines within their budget, `DATA/leasefs.log` rotated past `max` bytes.
pub fn init(data: &Path, max: u64) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(Sink(Rotating::of(data, max)))
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(PerUser)
        .with(fmt)
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A user gets a burst, then a few lines a second; what is left out
    /// is counted, per user, and reported once; another user's budget is
    /// their own.
    #[test]
    fn each_user_has_a_budget_of_log_lines() {
        let b = Budgets::default();
        let t0 = Instant::now();
        let written = (0..10_000).filter(|_| b.take(65534, t0)).count();
        assert_eq!(written, BURST as usize);
        assert!(b.take(1000, t0), "another user's line held back");
        let later = t0 + Duration::from_secs(2);
        let more = (0..100).filter(|_| b.take(65534, later)).count();
        assert_eq!(more, (2.0 * PER_SEC) as usize);
        let report = b.drain(later);
        assert_eq!(report, vec![(65534, 10_000 - 50 + 100 - 10)]);
        assert!(b.drain(later).is_empty(), "reported twice");
        // Budgets refilled in full are forgotten.
        b.drain(later + Duration::from_secs(3600));
        assert!(lock(&b.users).is_empty());
    }
}
