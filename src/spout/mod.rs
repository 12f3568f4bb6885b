//! A directory consumer compatible with Apache Storm's HdfsSpout layout,
//! with its locks held as leasefs leases (docs/SEMANTICS.md "Spout", README "Spout").
//!
//! Writers publish complete files into a source directory; any number of
//! [`Spout`] instances (processes, or threads of one) consume them, each
//! file by one instance at a time, every line emitted at least once:
//!
//! 1. pick the oldest file by mtime, skipping `*.ignore`, `*.inprogress`
//!    and hidden names;
//! 2. claim it by creating `LOCKDIR/NAME` exclusively and keeping it open
//!    for append under a client-renewed lease, then rename `NAME` to
//!    `NAME.inprogress`;
//! 3. emit each line, and every `commit_count` records or
//!    `commit_interval` append `<epoch-millis>,<id>,<offset>` to the lock
//!    file (Storm's format, see [`entry`]) for the records the consumer
//!    acknowledged (see [`emit`]);
//! 4. move the file to the done directory as `NAME`, delete the lock.
//!
//! While a file is consumed its instance holds the data file's write lease
//! too: nobody appends to it between the last read and the move.
//!
//! Before claiming a new file an instance looks for lock files idle for
//! longer than `lock_timeout` (under `LOCKDIR/DIRLOCK`) and takes one over
//! if its owner's lease is gone, resuming from its last entry (idleness
//! by the wall clock or, with `clocks_insync(false)`, by observation: see
//! [`idle`]). A line that is not UTF-8 text, holds a NUL byte or cannot be
//! read ends its file's good prefix: the lines before it are emitted, then
//! the file goes to the bad directory (Storm's rule). A consumer that makes
//! no progress for the progress timeout is killed and its file given up
//! ([`watch`]); `max_outstanding` bounds unacknowledged records. Nothing
//! here knows about the command line.
//!
//! ```no_run
//! use std::sync::atomic::AtomicBool;
//! use std::time::Duration;
//! use leasefs::spout::{Spout, StdoutEmitter};
//!
//! let stop = AtomicBool::new(false); // set it from a signal handler to stop cleanly
//! let stats = Spout::new("/mnt/lfs/in", "/mnt/lfs/done")
//!     .lock_timeout(Duration::from_secs(60))
//!     .once(true)
//!     .run(&mut StdoutEmitter::stdout(), &stop)?;
//! eprintln!("{stats}");
//!
//! // Any closure taking a record (a line without its newline) is an emitter.
//! let mut bytes = 0;
//! Spout::new("/mnt/lfs/in", "/mnt/lfs/done")
//!     .once(true)
//!     .run(&mut |line: &[u8]| -> Result<(), leasefs::spout::EmitError> {
//!         bytes += line.len();
//!         Ok(())
//!     }, &stop)?;
//! # Ok::<(), leasefs::spout::SpoutError>(())
//! ```

mod claim;
mod consume;
pub mod dirs;
pub mod emit;
pub mod entry;
pub mod error;
pub mod exec;
pub mod idle;
pub mod lock;
pub mod progress;
pub mod reader;
pub mod renew;
pub mod tree;
pub mod watch;

use std::path::{Path, PathBuf};
use std::time::Duration;

pub use emit::{Emitter, StdoutEmitter, WriteEmitter};
pub use entry::{LogEntry, Offset, Position};
pub use error::{EmitError, SpoutError};
pub use exec::ExecEmitter;
pub use progress::{Progress, Stats};
pub use watch::Watch;

use crate::sync::{Arc, AtomicBool};

/// Storm's defaults (HdfsSpout `Configs`).
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(300);
pub const DEFAULT_COMMIT_COUNT: u64 = 20_000;
pub const DEFAULT_COMMIT_INTERVAL: Duration = Duration::from_secs(10);
/// Renewal period of the spout's leases, at most: a quarter of the mount's
/// soft limit and half the lock timeout are used when shorter.
pub const DEFAULT_RENEW_INTERVAL: Duration = Duration::from_millis(1000);
/// How often an idle instance looks for new files.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(500);
/// Storm's default lock directory, inside the source directory.
pub const DEFAULT_LOCK_DIR: &str = ".lock";
/// Default bad-file directory, inside the source directory (Storm has no
/// default; a hidden name is never taken for a data file).
pub const DEFAULT_BAD_DIR: &str = ".bad";

/// One consumer instance: configuration (builder methods) and counters.
#[derive(Debug, Clone)]
pub struct Spout {
    source_dir: PathBuf,
    done_dir: PathBuf,
    bad_dir: Option<PathBuf>,
    lock_dir: Option<PathBuf>,
    lock_timeout: Duration,
    commit_count: u64,
    commit_interval: Duration,
    id: String,
    /// As given; `None`: derived from the soft limit ([`DEFAULT_RENEW_INTERVAL`]).
    renew_interval: Option<Duration>,
    poll_interval: Duration,
    once: bool,
    /// `None`: a consumer may make no progress for as long as it likes.
    progress_timeout: Option<Duration>,
    /// 0: no bound.
    max_outstanding: u64,
    clocks_insync: bool,
    progress: Arc<Progress>,
}

/// The directories of a run, resolved and created.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    pub source: PathBuf,
    pub done: PathBuf,
    pub bad: PathBuf,
    pub locks: PathBuf,
}

impl Spout {
    /// A spout over `source_dir` moving finished files to `done_dir`, with
    /// Storm's defaults and the id `HOST:PID` (the lease holder's form).
    pub fn new(source_dir: impl Into<PathBuf>, done_dir: impl Into<PathBuf>) -> Self {
        let host = nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .unwrap_or_else(|| "localhost".into());
        Spout {
            source_dir: source_dir.into(),
            done_dir: done_dir.into(),
            bad_dir: None,
            lock_dir: None,
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
            commit_count: DEFAULT_COMMIT_COUNT,
            commit_interval: DEFAULT_COMMIT_INTERVAL,
            id: format!("{host}:{}", std::process::id()),
            renew_interval: None,
            poll_interval: DEFAULT_POLL_INTERVAL,
            once: false,
            progress_timeout: None,
            max_outstanding: 0,
            clocks_insync: true,
            progress: Arc::new(Progress::default()),
        }
    }

    /// Where unreadable files go (default `SOURCE/.bad`).
    pub fn bad_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.bad_dir = Some(dir.into());
        self
    }
    /// Where lock files live (default `SOURCE/.lock`).
    pub fn lock_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.lock_dir = Some(dir.into());
        self
    }
    /// How long a lock file must be idle before a takeover is tried.
    pub fn lock_timeout(mut self, t: Duration) -> Self {
        self.lock_timeout = t;
        self
    }
    /// Commit progress every this many records (0: only by time).
    pub fn commit_count(mut self, n: u64) -> Self {
        self.commit_count = n;
        self
    }
    /// Commit progress at least this often while records flow.
    pub fn commit_interval(mut self, t: Duration) -> Self {
        self.commit_interval = t;
        self
    }
    /// The id written into lock entries (no comma, no newline).
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.id = id.into();
        self
    }
    /// Lease renewal period: at most half the mount's soft limit (checked
    /// when the run starts). By default a quarter of the soft limit, half
    /// the lock timeout or [`DEFAULT_RENEW_INTERVAL`], the shortest.
    pub fn renew_interval(mut self, t: Duration) -> Self {
        self.renew_interval = Some(t);
        self
    }
    /// How often an instance with nothing to do looks again.
    pub fn poll_interval(mut self, t: Duration) -> Self {
        self.poll_interval = t;
        self
    }
    /// Return once nothing is left: no file to claim, no lock file (of
    /// this or any instance) and no DIRLOCK. Otherwise run until stopped.
    pub fn once(mut self, once: bool) -> Self {
        self.once = once;
        self
    }

    /// Kill a consumer that neither takes nor acknowledges a record for
    /// this long (whole process tree), stop renewing its file's leases and
    /// give the file up for another instance. `None`: never. The CLI's
    /// default is the lock timeout.
    pub fn progress_timeout(mut self, t: Option<Duration>) -> Self {
        self.progress_timeout = t;
        self
    }
    /// At most this many records emitted and not yet acknowledged (Storm's
    /// `hdfsspout.max.outstanding`); 0: no bound.
    pub fn max_outstanding(mut self, n: u64) -> Self {
        self.max_outstanding = n;
        self
    }
    /// Storm's `hdfsspout.clocks.insync`: `true` (the default) decides a
    /// lock file's idleness by comparing its modification time and last
    /// entry with this host's wall clock; `false` by watching it: idle once
    /// it did not change for the lock timeout of this instance's own
    /// monotonic clock, whatever the clocks say.
    pub fn clocks_insync(mut self, insync: bool) -> Self {
        self.clocks_insync = insync;
        self
    }

    pub fn spout_id(&self) -> &str {
        &self.id
    }

    /// Live counters, for a progress display on another thread.
    pub fn progress(&self) -> Arc<Progress> {
        self.progress.clone()
    }

    /// Consumes files until `stop` is set (or, with [`Spout::once`], until
    /// nothing is left). On `stop` the current record is finished, its
    /// offset committed and the locks are released (the file's lock file
    /// stays, closed, for a later takeover that resumes there; DIRLOCK is
    /// deleted); the run then returns normally.
    pub fn run(&self, emitter: &mut dyn Emitter, stop: &AtomicBool) -> Result<Stats, SpoutError> {
        self.check()?;
        let layout = self.prepare()?;
        let renew = self.renewal(&layout)?;
        consume::Run::new(self, &layout, emitter, stop, renew)?.run()
    }

    /// The renewal period for the mount of `layout`'s locks: leases live
    /// only `soft_limit` unrenewed, so a period longer than half of it
    /// would let a live instance lose its files.
    fn renewal(&self, layout: &Layout) -> Result<Duration, SpoutError> {
        let soft = dirs::soft_limit_of(&layout.locks);
        match (self.renew_interval, soft) {
            (Some(r), Some(s)) if r > s / 2 => Err(SpoutError::Config(format!(
                "the renewal interval ({} ms) must be at most half the mount's soft limit ({} ms)",
                r.as_millis(),
                s.as_millis()
            ))),
            (Some(r), _) => Ok(r),
            (None, soft) => {
                let mut r = DEFAULT_RENEW_INTERVAL.min(self.lock_timeout / 2);
                if let Some(s) = soft {
                    r = r.min(s / 4);
                }
                Ok(r.max(Duration::from_millis(10)))
            }
        }
    }

    fn check(&self) -> Result<(), SpoutError> {
        let bad = |m: &str| Err(SpoutError::Config(m.to_string()));
        if self.id.is_empty() || self.id.contains([',', '\n', '\r']) {
            return bad("the spout id must be non-empty, without commas or newlines");
        }
        if self.lock_timeout.is_zero() {
            return bad("the lock timeout must be greater than 0");
        }
        if self.commit_interval.is_zero() {
            return bad("the commit interval must be greater than 0");
        }
        if self.progress_timeout.is_some_and(|t| t.is_zero()) {
            return bad("the progress timeout must be greater than 0");
        }
        if let Some(r) = self.renew_interval {
            if r.is_zero() {
                return bad("the renewal interval must be greater than 0");
            }
            if r >= self.lock_timeout {
                return bad("the renewal interval must be shorter than the lock timeout");
            }
        }
        Ok(())
    }

    /// Resolves the directories, creates the missing ones, and refuses
    /// done/bad directories on another filesystem (moves are renames).
    fn prepare(&self) -> Result<Layout, SpoutError> {
        use std::os::unix::fs::MetadataExt;
        let source = &self.source_dir;
        let meta = std::fs::metadata(source).map_err(|e| SpoutError::Dir {
            what: "source",
            path: source.clone(),
            source: e,
        })?;
        if !meta.is_dir() {
            return Err(SpoutError::Config(format!(
                "{} is not a directory",
                source.display()
            )));
        }
        let not_leasefs = |path: &Path, e| SpoutError::NotLeasefs {
            path: path.to_path_buf(),
            source: e,
        };
        dirs::check_leasefs(source).map_err(|e| not_leasefs(source, e))?;
        let layout = Layout {
            source: source.clone(),
            done: self.done_dir.clone(),
            bad: self
                .bad_dir
                .clone()
                .unwrap_or_else(|| source.join(DEFAULT_BAD_DIR)),
            locks: self
                .lock_dir
                .clone()
                .unwrap_or_else(|| source.join(DEFAULT_LOCK_DIR)),
        };
        let dirs = [
            ("done", &layout.done),
            ("bad", &layout.bad),
            ("lock", &layout.locks),
        ];
        // Checked before anything is created: a wrong path leaves nothing.
        for (what, dir) in &dirs[..2] {
            if nearest_dev(dir) != Some(meta.dev()) {
                return Err(SpoutError::CrossDevice {
                    what,
                    path: dir.to_path_buf(),
                    source_dir: source.clone(),
                });
            }
        }
        for (what, dir) in dirs {
            make_dir(what, dir)?;
        }
        dirs::check_leasefs(&layout.locks).map_err(|e| not_leasefs(&layout.locks, e))?;
        Ok(layout)
    }
}

/// The device of `dir`, or of its nearest existing ancestor when it does
/// not exist yet (it would be created there).
fn nearest_dev(dir: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    dir.ancestors()
        .find_map(|a| {
            std::fs::metadata(if a.as_os_str().is_empty() {
                Path::new(".")
            } else {
                a
            })
            .ok()
        })
        .map(|m| m.dev())
}

fn make_dir(what: &'static str, dir: &Path) -> Result<(), SpoutError> {
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(SpoutError::Config(format!(
            "{what} directory {} is not a directory",
            dir.display()
        ))),
        Err(_) => std::fs::create_dir_all(dir).map_err(|e| SpoutError::Dir {
            what,
            path: dir.to_path_buf(),
            source: e,
        }),
    }
}
