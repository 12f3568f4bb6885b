//! How a spout gets a file to consume: an idle lock to take over first
//! (Storm's first step, under DIRLOCK), else the oldest new file. Either
//! way it ends up holding two leases: the lock file's, and the data
//! file's own write lease, so that nobody can append to a file while it is
//! consumed (an append between the last read and the move to done would
//! never be emitted).

use std::ffi::{OsStr, OsString};
use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use super::dirs::{self, INPROGRESS};
use super::entry::{self, Position};
use super::idle::{Judge, Observer};
use super::lock::{self, DirLock, FileLock, LockError, TakeOver, lock_err, set_blocking};
use super::reader::ReadError;
use super::renew::{RenewedLease, Renewer};
use super::{Layout, Spout, SpoutError};
use crate::clock::wall_ms;
use crate::sync::{AtomicBool, Ordering};

/// A file this instance holds the lock of.
pub(super) struct Claim {
    pub lock: FileLock,
    /// The name without `.inprogress` (also the lock file's name).
    pub name: OsString,
    /// `SOURCE/NAME.inprogress`.
    pub data: PathBuf,
    /// Where to start reading.
    pub start: Position,
    /// The data file's write lease: held until it is moved; `None` where
    /// the file could not be opened for writing (permissions).
    pub data_lease: Option<RenewedLease>,
    /// Why the recorded place cannot be resumed: the file goes to the bad
    /// directory.
    pub unusable: Option<ReadError>,
}

impl Claim {
    pub fn display(&self) -> std::borrow::Cow<'_, str> {
        self.name.to_string_lossy()
    }

    /// Both leases are still ours (see `RenewedLease::still_held`).
    pub fn still_held(&self) -> bool {
        self.lock.still_held() && self.data_lease.as_ref().is_none_or(|l| l.still_held())
    }
}

/// What came of opening a data file for writing.
enum DataLease {
    Held(RenewedLease),
    /// Someone else holds its lease (a writer, or a previous owner whose
    /// lease has not expired yet).
    Busy,
    /// It cannot be opened for writing here (permissions, read-only):
    /// consumed without the lease.
    Unavailable(std::io::Error),
    Gone,
}

/// Takes the write lease of data file `path` without waiting, switched to
/// client renewal like the locks.
fn data_lease(renewer: &Renewer, path: &Path) -> Result<DataLease, LockError> {
    let f = match OpenOptions::new()
        .append(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if matches!(e.raw_os_error(), Some(libc::EBUSY) | Some(libc::EAGAIN)) => {
            return Ok(DataLease::Busy);
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(DataLease::Gone),
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EACCES) | Some(libc::EPERM) | Some(libc::EROFS)
            ) =>
        {
            return Ok(DataLease::Unavailable(e));
        }
        Err(e) => return Err(e.into()),
    };
    set_blocking(&f);
    renewer
        .adopt_watched(f)
        .map(DataLease::Held)
        .map_err(LockError::NoClientRenewal)
}

fn name_of(path: &Path) -> Option<OsString> {
    path.file_name().map(OsStr::to_os_string)
}

/// What picking files needs and remembers across picks: the spout's
/// settings and directories, the renewal thread every lease it takes is
/// handed to, and the candidates of the last listing.
pub(super) struct Claimer<'a> {
    pub spout: &'a Spout,
    pub layout: &'a Layout,
    stop: &'a AtomicBool,
    pub renewer: Renewer,
    /// Candidates from the last listing, oldest first. A directory is
    /// listed again only once they are used up, so picking each of N files
    /// does not cost a listing of N entries (N² for the directory).
    queue: VecDeque<PathBuf>,
    warned_no_data_lease: bool,
    /// What this instance saw of the lock files (`clocks_insync(false)`).
    observer: Observer,
    /// Files this instance gave up because their consumer stalled, and
    /// when: not taken back before the lock timeout has passed again, so
    /// that another instance gets them first.
    given_up: HashMap<OsString, Instant>,
}

/// How idleness is judged now: by the wall clock, or by what was observed.
fn judge<'o>(spout: &Spout, observer: &'o Observer) -> Judge<'o> {
    if spout.clocks_insync {
        Judge::Clocks {
            now_ms: wall_ms(),
            timeout: spout.lock_timeout,
        }
    } else {
        Judge::Observed {
            observer,
            timeout: spout.lock_timeout,
        }
    }
}

impl<'a> Claimer<'a> {
    pub fn new(
        spout: &'a Spout,
        layout: &'a Layout,
        stop: &'a AtomicBool,
        renewer: Renewer,
    ) -> Self {
        Claimer {
            spout,
            layout,
            stop,
            renewer,
            queue: VecDeque::new(),
            warned_no_data_lease: false,
            observer: Observer::default(),
            given_up: HashMap::new(),
        }
    }

    pub fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    pub fn stop_flag(&self) -> &'a AtomicBool {
        self.stop
    }

    /// This instance gave `name` up (its consumer stalled).
    pub fn gave_up(&mut self, name: &OsStr) {
        self.given_up.insert(name.to_os_string(), Instant::now());
    }

    /// The idleness judge for now (see [`super::idle`]).
    pub fn judge(&self) -> Judge<'_> {
        judge(self.spout, &self.observer)
    }

    /// Looks at the lock files (and DIRLOCK) for the observed idleness.
    fn observe(&mut self, locks: &[(PathBuf, std::fs::Metadata)]) {
        let dirlock = self.layout.locks.join(lock::DIRLOCK);
        let mut present: Vec<PathBuf> = locks.iter().map(|(p, _)| p.clone()).collect();
        for (p, m) in locks {
            self.observer.observe(p, m);
        }
        if let Ok(m) = std::fs::metadata(&dirlock) {
            self.observer.observe(&dirlock, &m);
            present.push(dirlock);
        }
        self.observer.keep_only(&present);
    }

    pub(super) fn next_file(&mut self) -> Result<Option<Claim>, SpoutError> {
        if let Some(c) = self.take_over_idle()? {
            return Ok(Some(c));
        }
        self.claim_new()
    }

    /// Storm's first step: an abandoned file (idle lock, owner's lease
    /// gone) is resumed before any new file is started. DIRLOCK is only
    /// taken when some lock file is idle by its mtime at all.
    fn take_over_idle(&mut self) -> Result<Option<Claim>, SpoutError> {
        let locks_dir = self.layout.locks.clone();
        let locks = lock::list_lock_files(&locks_dir).map_err(|e| SpoutError::io(&locks_dir, e))?;
        if !self.spout.clocks_insync {
            self.observe(&locks);
        }
        let timeout = self.spout.lock_timeout;
        self.given_up.retain(|_, at| at.elapsed() < timeout);
        if !lock::any_idle(&locks, self.judge()) {
            return Ok(None);
        }
        let Some(dirlock) = DirLock::acquire(&self.renewer, &locks_dir, self.judge())
            .map_err(|e| lock_err(&locks_dir.join(lock::DIRLOCK), e))?
        else {
            return Ok(None);
        };
        let found = self.scan_idle(&locks);
        let released = dirlock.release();
        let found = found?;
        if let Err(e) = released {
            tracing::warn!("could not delete DIRLOCK: {e}");
        }
        Ok(found)
    }

    /// Under DIRLOCK: takes over the oldest idle lock whose leases can be
    /// had, and finds the place to resume in its data file.
    fn scan_idle(
        &mut self,
        locks: &[(PathBuf, std::fs::Metadata)],
    ) -> Result<Option<Claim>, SpoutError> {
        let s = self.spout;
        for (path, _) in locks {
            let Some(name) = name_of(path) else {
                continue;
            };
            if self.given_up.contains_key(&name) {
                continue;
            }
            let (lock, previous) =
                match FileLock::take_over(&self.renewer, path, &s.id, self.judge()) {
                    Ok(TakeOver::Taken { lock, previous }) => (lock, previous),
                    Ok(_) | Err(LockError::Lost) => continue,
                    Err(e) => return Err(lock_err(path, e)),
                };
            let prev = previous.as_ref().map_or_else(
                || "no entry (empty or truncated lock file)".to_string(),
                |e| format!("last entry by {} at {}", e.spout_id, e.time_ms),
            );
            let Some((data, renamed_now)) = self.data_file_of(&name)? else {
                tracing::warn!(
                    "took over idle lock {} ({prev}) but {} is gone from the source directory (finished by its last owner); deleting the lock",
                    path.display(),
                    name.to_string_lossy()
                );
                if let Err(e) = lock.release() {
                    tracing::warn!("could not delete {}: {e}", path.display());
                }
                continue;
            };
            let data_lease =
                match data_lease(&self.renewer, &data).map_err(|e| lock_err(&data, e))? {
                    DataLease::Held(l) => Some(l),
                    DataLease::Unavailable(e) => {
                        self.note_no_data_lease(&data, &e);
                        None
                    }
                    DataLease::Busy | DataLease::Gone => {
                        // Its previous owner's lease on the data file has not
                        // run out yet, or it was just finished: later.
                        lock.abandon();
                        continue;
                    }
                };
            self.spout.progress.took_over();
            // An owner emits nothing before its rename to `.inprogress`: a
            // file still under its plain name was never read (or is a new
            // file of the same name, published after an owner died between
            // its move to done and its lock's deletion). Start it at 0.
            let located = if renamed_now {
                Ok(Position::default())
            } else {
                let offset = previous.map_or(entry::Offset::Start, |e| e.offset);
                entry::locate(&data, offset)
            };
            let (start, unusable) = match located {
                Ok(p) => (p, None),
                Err(e) => (Position::default(), Some(e)),
            };
            if unusable.is_none()
                && let Err(e) = lock.commit(start, wall_ms())
            {
                tracing::warn!("cannot record the takeover of {}: {e}", path.display());
                lock.abandon();
                continue;
            }
            tracing::warn!(
                "took over idle lock {} of {} ({prev}); resuming at offset {}",
                path.display(),
                name.to_string_lossy(),
                start.bytes
            );
            return Ok(Some(Claim {
                lock,
                name,
                data,
                start,
                data_lease,
                unusable,
            }));
        }
        Ok(None)
    }

    /// The data file of a taken-over lock: `NAME.inprogress`, or `NAME`
    /// (renamed now, and `true`) when its owner died between locking and
    /// renaming.
    fn data_file_of(&self, name: &OsStr) -> Result<Option<(PathBuf, bool)>, SpoutError> {
        let src = &self.layout.source;
        let inprogress = dirs::inprogress_path(src, name);
        if inprogress.exists() {
            return Ok(Some((inprogress, false)));
        }
        match std::fs::rename(src.join(name), &inprogress) {
            Ok(()) => Ok(Some((inprogress, true))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(SpoutError::io(src.join(name), e)),
        }
    }

    /// Storm's second step: the oldest candidate that can be locked.
    fn claim_new(&mut self) -> Result<Option<Claim>, SpoutError> {
        let src = &self.layout.source;
        if self.queue.is_empty() {
            self.queue = dirs::list_candidates(src)
                .map_err(|e| SpoutError::io(src, e))?
                .into();
        }
        while let Some(path) = self.queue.pop_front() {
            if self.stopping() {
                return Ok(None);
            }
            if std::fs::symlink_metadata(&path).is_err() {
                continue; // claimed by another instance since the listing
            }
            let Some(name) = name_of(&path) else {
                continue;
            };
            if dirs::is_being_written(&path) {
                tracing::debug!(
                    "{} is still open for writing; not claimed yet",
                    name.to_string_lossy()
                );
                continue;
            }
            let lock_path = self.layout.locks.join(&name);
            let lock =
                match FileLock::try_create(&self.renewer, &lock_path, &self.spout.id, wall_ms()) {
                    Ok(Some(l)) => l,
                    Ok(None) | Err(LockError::Lost) => continue,
                    Err(e) => return Err(lock_err(&lock_path, e)),
                };
            // The data file's lease before the rename: a writer that opened
            // it since our look at its lease keeps it, and we leave it.
            let data_lease =
                match data_lease(&self.renewer, &path).map_err(|e| lock_err(&path, e))? {
                    DataLease::Held(l) => Some(l),
                    DataLease::Unavailable(e) => {
                        self.note_no_data_lease(&path, &e);
                        None
                    }
                    DataLease::Busy | DataLease::Gone => {
                        if let Err(e) = lock.release() {
                            tracing::warn!("could not delete {}: {e}", lock_path.display());
                        }
                        continue;
                    }
                };
            let data = dirs::inprogress_path(src, &name);
            if let Err(e) = std::fs::rename(&path, &data) {
                // Gone: another instance finished it between our listing
                // and our lock (its lock was already deleted).
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(
                        "cannot rename {} to {INPROGRESS}: {e}; skipped",
                        path.display()
                    );
                }
                drop(data_lease);
                if let Err(e) = lock.release() {
                    tracing::warn!("could not delete {}: {e}", lock_path.display());
                }
                continue;
            }
            tracing::info!("consuming {}", name.to_string_lossy());
            return Ok(Some(Claim {
                lock,
                name,
                data,
                start: Position::default(),
                data_lease,
                unusable: None,
            }));
        }
        Ok(None)
    }

    /// Said once per run: files that cannot be opened for writing are
    /// consumed without their lease, so a writer could still append to one
    /// while it is consumed.
    fn note_no_data_lease(&mut self, path: &Path, e: &std::io::Error) {
        if !self.warned_no_data_lease {
            self.warned_no_data_lease = true;
            tracing::warn!(
                "{} cannot be opened for writing ({e}): files like it are consumed without holding their write lease, so an append while they are consumed could be missed",
                path.display()
            );
        }
    }
}
