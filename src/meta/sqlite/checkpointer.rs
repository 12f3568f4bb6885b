//! Checkpoints of the WAL, made mostly by a thread of their own.
//!
//! Why. SQLite's automatic checkpoint runs inside the commit that takes
//! the WAL past 1,000 pages: that commit copies the pages into the
//! database and syncs the WAL and the database, on whichever thread
//! committed. Most commits are made on a FUSE request's thread (a
//! create, a rename), so every few dozen small files one request held
//! its ring, and the connection every other request needs, for a
//! millisecond or more (benches/PROFILE.md, "fifteenth look"). Nothing
//! that waits for the disk should run on a request thread.
//!
//! So this thread, on a connection of its own, makes a `PASSIVE`
//! checkpoint every [`EVERY`] commits: it copies and syncs while writers
//! go on (a WAL checkpoint blocks no writer). What it cannot do is start
//! the WAL over: SQLite does that at the first commit that finds every
//! frame copied, which commits made during the copy never let happen. So
//! the store's connection still checkpoints by itself, but only past
//! [`RESTART_AT_PAGES`]: four times as rarely as before, and with most
//! pages copied already. The WAL file then stays at that length, written
//! over in place: a WAL that grew would cost each `fdatasync` its inode.
//!
//! A checkpoint that fails to write or sync is a failed sync of the
//! store: its error is kept as the WAL's own failed sync is (see
//! `MetaStore::sync_failed`), so no fsync reports success after it.

use std::path::Path;
use std::thread::JoinHandle;

use rusqlite::Connection;

use crate::error::FsError;
use crate::sync::{Arc, AtomicU64, Condvar, Mutex, Ordering, lock};

/// Commits between two checkpoints of this thread: some 1,500 to 2,000
/// pages for the commits of small files.
pub(super) const EVERY: u64 = 256;

/// Pages of WAL past which a commit checkpoints it itself (SQLite's
/// `wal_autocheckpoint`, 1,000 by default), and the WAL starts over.
pub(super) const RESTART_AT_PAGES: u32 = 4_096;

#[derive(Default)]
struct State {
    stop: bool,
    /// Unit tests: checkpoints wait while this holds.
    #[cfg(test)]
    paused: bool,
}

struct Shared {
    /// Commits since the last checkpoint began.
    commits: AtomicU64,
    state: Mutex<State>,
    wake: Condvar,
    /// Checkpoints made (for tests and the record).
    made: AtomicU64,
}

pub(super) struct Checkpointer {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Checkpointer {
    /// Starts the thread on a new connection to `db`; `None` (with a
    /// warning) where that connection cannot be opened: the caller then
    /// keeps SQLite's automatic checkpoints as they are.
    pub(super) fn start(db: &Path, failed: Arc<Mutex<Option<FsError>>>) -> Option<Checkpointer> {
        let conn = match Connection::open(db).and_then(|c| {
            c.busy_timeout(std::time::Duration::from_secs(5))?;
            c.pragma_update(None, "wal_autocheckpoint", 0)?;
            Ok(c)
        }) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(
                    "cannot open a second connection to {} for checkpoints ({e}); the commits checkpoint as they go",
                    db.display()
                );
                return None;
            }
        };
        let shared = Arc::new(Shared {
            commits: AtomicU64::new(0),
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
            made: AtomicU64::new(0),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("meta-checkpoint".into())
            .spawn(move || run(&s, &conn, &failed))
            .map_err(|e| tracing::warn!("cannot start the checkpoint thread ({e})"))
            .ok()?;
        Some(Checkpointer {
            shared,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// A commit was made; every [`EVERY`]th wakes the thread.
    pub(super) fn committed(&self) {
        let n = self.shared.commits.fetch_add(1, Ordering::AcqRel) + 1;
        if n == EVERY {
            let _state = lock(&self.shared.state);
            self.shared.wake.notify_one();
        }
    }

    /// Checkpoints made so far.
    #[cfg(test)]
    pub(super) fn made(&self) -> u64 {
        self.shared.made.load(Ordering::Acquire)
    }

    #[cfg(test)]
    pub(super) fn pause(&self, paused: bool) {
        lock(&self.shared.state).paused = paused;
        self.shared.wake.notify_one();
    }

    /// Stops the thread (its connection closed) and waits for it.
    pub(super) fn stop(&self) {
        lock(&self.shared.state).stop = true;
        self.shared.wake.notify_one();
        if let Some(t) = lock(&self.thread).take() {
            let _ = t.join();
        }
    }
}

impl Drop for Checkpointer {
    /// Never a thread left waiting on a store that is gone (as when the
    /// store's opening fails after the thread started).
    fn drop(&mut self) {
        self.stop();
    }
}

fn run(s: &Shared, conn: &Connection, failed: &Mutex<Option<FsError>>) {
    loop {
        {
            let mut state = lock(&s.state);
            loop {
                if state.stop {
                    return;
                }
                #[cfg(test)]
                let paused = state.paused;
                #[cfg(not(test))]
                let paused = false;
                if !paused && s.commits.load(Ordering::Acquire) >= EVERY {
                    break;
                }
                state = s.wake.wait(state).unwrap_or_else(|e| e.into_inner());
            }
        }
        s.commits.store(0, Ordering::Release);
        match conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
            Ok(()) => {
                s.made.fetch_add(1, Ordering::AcqRel);
            }
            // Another checkpoint under way (an operator's): next time.
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::DatabaseBusy =>
            {
                tracing::debug!("checkpoint of the WAL skipped: busy");
            }
            // The database file could not grow: the WAL keeps every
            // frame (none counts as copied until the database is synced),
            // so nothing is lost; the next checkpoint tries again.
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::DiskFull =>
            {
                tracing::warn!(
                    "checkpoint of the metadata WAL: the disk is full; the WAL grows until it can be copied"
                );
            }
            Err(e) => {
                tracing::error!(
                    "the checkpoint of the metadata WAL failed; the store cannot be made durable, from now on: {e}"
                );
                lock(failed)
                    .get_or_insert_with(|| FsError::Io(format!("checkpoint of the WAL: {e}")));
            }
        }
    }
}
