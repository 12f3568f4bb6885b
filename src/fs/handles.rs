//! Open file descriptions (FUSE file handles) and the per-inode state they
//! share: the one output stream of a file, how many opens remain, what a
//! write must drop first (see `privs`), and the closes still finishing.
//! [`Handles`] owns all of it; nothing else keeps a handle table.

use std::time::{Duration, Instant};

use dashmap::DashMap;

use super::privs;
use crate::error::{FsError, FsResult};
use crate::pipeline::OutputStream;
use crate::pipeline::reader::OpenReplicas;
use crate::sync::{
    Arc, AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Condvar, Mutex, MutexGuard, Ordering, lock,
};

/// One open file description.
pub struct Handle {
    pub fh: u64,
    pub ino: u64,
    pub write: bool,
    pub append: bool,
    /// Opened `O_SYNC`/`O_DSYNC`: every write returns durable, as after an
    /// fsync. The kernel follows a write with an fsync only on page-cache
    /// files; write handles are direct I/O, so leasefs does it.
    pub sync_writes: bool,
    /// Reads go through the kernel's page cache (see `cache`).
    pub cached: bool,
    pub epoch: u64,
    pub tgid: u32,
    /// The election term's fence of the process that opened it, if any:
    /// writes through it are refused once that term is over.
    pub fence: Option<u32>,
    /// The opener's uid: who may see a write handle's holder details.
    pub uid: u32,
    /// Flushed (close()) with no write since: a conflicting open may wait
    /// for this handle's pending RELEASE instead of failing.
    pub flushed: AtomicBool,
    /// Opened by a create whose reply let the kernel keep the new file's
    /// attributes for a tick (see the adapter's `CREATED_TTL`), and not
    /// written through yet: its first write has the kernel forget them
    /// first (see `Core::write_checked`).
    pub fresh: AtomicBool,
    pub stream: Option<Arc<OutputStream>>,
    /// Which grant of this description may write now (see [`Gate`]);
    /// shared by the handles that stand for the description's later
    /// grants.
    pub gate: Arc<Gate>,
    /// Replica readers kept between this handle's reads.
    pub replicas: OpenReplicas,
}

impl Handle {
    /// Whether this handle's grant is the description's live one.
    pub fn live(&self) -> bool {
        self.gate.live(self.epoch)
    }
}

/// The grant an open file description writes under. Over etcd a close
/// (FLUSH by the holder) ends the grant before it returns, so that a
/// writer on any daemon is granted the file at once; copies of the
/// descriptor (dup, fork) that write afterwards take the file again, as a
/// new grant with its own epoch and stream (`Core::regrant`). Writes
/// enter under the gate's lock, so none reaches a grant's stream once the
/// close that ends it has begun.
#[derive(Default)]
pub struct Gate {
    st: Mutex<GateState>,
    cv: Condvar,
}

/// See [`Gate`].
#[derive(Default)]
pub struct GateState {
    /// The epoch of the live grant; 0: none (ended at a close).
    live: u64,
    /// A close is ending the grant, or a new grant is being taken.
    busy: bool,
}

impl Gate {
    pub fn new(epoch: u64) -> Arc<Gate> {
        Arc::new(Gate {
            st: Mutex::new(GateState {
                live: epoch,
                busy: false,
            }),
            cv: Condvar::new(),
        })
    }

    pub fn live(&self, epoch: u64) -> bool {
        let s = lock(&self.st);
        !s.busy && s.live == epoch
    }

    /// Held while a write of grant `epoch` enters its stream; `None` when
    /// that grant is not the live one.
    pub fn enter(&self, epoch: u64) -> Option<MutexGuard<'_, GateState>> {
        let s = lock(&self.st);
        (!s.busy && s.live == epoch).then_some(s)
    }

    /// A close starts ending grant `epoch`: false if it is not live.
    pub fn end_begin(&self, epoch: u64) -> bool {
        let mut s = lock(&self.st);
        if s.busy || s.live != epoch {
            return false;
        }
        s.busy = true;
        true
    }

    /// The close is done: the grant ended (`ended`) or stays live.
    pub fn end_done(&self, ended: bool) {
        let mut s = lock(&self.st);
        s.busy = false;
        if ended {
            s.live = 0;
        }
        self.cv.notify_all();
    }

    /// Waits for a close or grant under way; `Some(epoch)` if a grant is
    /// live, else `None` and the caller takes a new one (it must call
    /// [`Gate::grant_done`]).
    pub fn grant_begin(&self) -> Option<u64> {
        let mut s = lock(&self.st);
        while s.busy {
            s = self.cv.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        if s.live != 0 {
            return Some(s.live);
        }
        s.busy = true;
        None
    }

    /// The new grant's epoch, if it was granted.
    pub fn grant_done(&self, epoch: Option<u64>) {
        let mut s = lock(&self.st);
        s.busy = false;
        s.live = epoch.unwrap_or(0);
        self.cv.notify_all();
    }
}

/// Per-inode state while any handle is open.
#[derive(Default)]
pub struct OpenFile {
    opens: Mutex<usize>,
    pub stream: Mutex<Option<Arc<OutputStream>>>,
    /// What a write must drop first (`privs::MODE`, `privs::CAPS`), as
    /// known since a writer opened the file; kept current by this daemon's
    /// chmod and setxattr.
    pub privs: AtomicU8,
    /// Its last name was removed while it was open (set under `opens`):
    /// the last release deletes it.
    unlinked: AtomicBool,
}

/// The handle table of a mount.
pub struct Handles {
    by_fh: DashMap<u64, Arc<Handle>>,
    files: DashMap<u64, Arc<OpenFile>>,
    next_fh: AtomicU64,
    /// Closes still finishing, so unmount can wait for them.
    closing: AtomicUsize,
}

impl Default for Handles {
    fn default() -> Self {
        Handles {
            by_fh: DashMap::new(),
            files: DashMap::new(),
            next_fh: AtomicU64::new(1),
            closing: AtomicUsize::new(0),
        }
    }
}

impl Handles {
    /// A handle number not given out before (by this daemon).
    pub fn next_fh(&self) -> u64 {
        self.next_fh.fetch_add(1, Ordering::Relaxed)
    }

    pub fn get(&self, fh: u64) -> FsResult<Arc<Handle>> {
        self.by_fh
            .get(&fh)
            .map(|h| h.clone())
            .ok_or(FsError::BadHandle)
    }

    /// Adds an open of its inode.
    pub fn register(&self, h: Handle) -> Arc<Handle> {
        let h = Arc::new(h);
        let of = self.open_file(h.ino);
        *lock(&of.opens) += 1;
        self.by_fh.insert(h.fh, h.clone());
        h
    }

    /// Puts a new grant's handle in place of its description's handle
    /// (same number, no new open).
    pub fn replace(&self, h: Handle) -> Arc<Handle> {
        let h = Arc::new(h);
        self.by_fh.insert(h.fh, h.clone());
        h
    }

    /// Takes a handle out of the table (its open is dropped later, by
    /// [`Handles::drop_open`], once its close has finished).
    pub fn remove(&self, fh: u64) -> Option<Arc<Handle>> {
        self.by_fh.remove(&fh).map(|(_, h)| h)
    }

    /// The per-inode state of `ino`, created if no handle has it open.
    pub fn open_file(&self, ino: u64) -> Arc<OpenFile> {
        self.files.entry(ino).or_default().clone()
    }

    /// The per-inode state of `ino`, if a handle has it open.
    pub fn file(&self, ino: u64) -> Option<Arc<OpenFile>> {
        self.files.get(&ino).map(|f| f.clone())
    }

    /// The live stream of a file, if a writer has it open.
    pub fn stream_of(&self, ino: u64) -> Option<Arc<OutputStream>> {
        self.files.get(&ino).and_then(|f| lock(&f.stream).clone())
    }

    /// Every live stream of the mount.
    pub fn streams(&self) -> Vec<Arc<OutputStream>> {
        self.files
            .iter()
            .filter_map(|f| lock(&f.stream).clone())
            .collect()
    }

    /// One open of `ino` fewer. When it was the last: `Some`, with whether
    /// its last name was removed meanwhile ([`Handles::unlinked_while_open`]).
    pub fn drop_open(&self, ino: u64) -> Option<bool> {
        let last = {
            let of = self.file(ino)?;
            let mut n = lock(&of.opens);
            *n = n.saturating_sub(1);
            (*n == 0).then(|| of.unlinked.load(Ordering::Relaxed))
        };
        if last.is_some() {
            self.files.remove_if(&ino, |_, f| *lock(&f.opens) == 0);
        }
        last
    }

    /// The last name of `ino` is gone: true when it is open (its last
    /// release is told, see [`Handles::drop_open`]), false when the caller
    /// deletes it now. Decided under the same lock as the last release,
    /// so exactly one of the two deletes it.
    pub fn unlinked_while_open(&self, ino: u64) -> bool {
        let Some(of) = self.file(ino) else {
            return false;
        };
        let n = lock(&of.opens);
        if *n == 0 {
            return false;
        }
        of.unlinked.store(true, Ordering::Relaxed);
        true
    }

    /// The first handle for which `pred` holds.
    pub fn find(&self, pred: impl Fn(&Handle) -> bool) -> Option<Arc<Handle>> {
        self.by_fh.iter().find(|h| pred(h)).map(|h| h.clone())
    }

    /// Every handle for which `pred` holds.
    pub fn filter(&self, pred: impl Fn(&Handle) -> bool) -> Vec<Arc<Handle>> {
        self.by_fh
            .iter()
            .filter(|h| pred(h))
            .map(|h| h.clone())
            .collect()
    }

    /// Records what a writer of `ino` must drop, if the file is open here;
    /// `keep_caps`: what is known of its capabilities stays.
    pub fn note_privs(&self, ino: u64, bits: u8, keep_caps: bool) {
        if let Some(f) = self.files.get(&ino) {
            let caps = if keep_caps {
                f.privs.load(Ordering::Relaxed) & privs::CAPS
            } else {
                0
            };
            f.privs.store(bits | caps, Ordering::Relaxed);
        }
    }

    /// `ino` got capabilities (a setxattr of this daemon).
    pub fn note_caps(&self, ino: u64) {
        if let Some(f) = self.files.get(&ino) {
            f.privs.fetch_or(privs::CAPS, Ordering::Relaxed);
        }
    }

    /// Whether a write with the kernel's kill flag `kill` must first drop
    /// privileges (cheap: what the daemon already knows of the file).
    pub fn privs_to_drop(&self, ino: u64, kill: bool) -> bool {
        self.files.get(&ino).is_some_and(|f| {
            let p = f.privs.load(Ordering::Relaxed);
            p & privs::CAPS != 0 || (kill && p & privs::MODE != 0)
        })
    }

    /// A close starts finishing in the background.
    pub fn close_started(&self) {
        self.closing.fetch_add(1, Ordering::SeqCst);
    }

    /// A close that [`Handles::close_started`] announced has finished.
    pub fn close_finished(&self) {
        self.closing.fetch_sub(1, Ordering::SeqCst);
    }

    /// Waits until closes in progress have finished, at most `max`
    /// (unmount).
    pub fn wait_closes(&self, max: Duration) -> bool {
        let deadline = Instant::now() + max;
        while self.closing.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        self.closing.load(Ordering::SeqCst) == 0
    }
}
