//! A second thread per queue, for large READs only.
//!
//! The kernel queues a request on the ring of the CPU that issued it, and
//! a reader that reads ahead has two large READs in flight there; one
//! thread per queue serves them one after the other, where `/dev/fuse`'s
//! several threads serve them at once (a daemon-served 1 GiB read, pages
//! warm: 2,098 MB/s against 2,407–2,999 over `/dev/fuse`). A helper that
//! registered entries of its own got READs, but the kernel hands any
//! request to the free entry made free last, so it got a stream of small
//! requests too, each one a wake-up the main thread did not pay (creates
//! without fsync −10 to −27%).
//!
//! So the helper registers no entry. The main thread hands it a large READ
//! when it holds no entry; the helper serves it and commits it from its
//! own io_uring, and the entry's next request then completes there (the
//! kernel takes a commit from any io_uring, and fetches the next request
//! for the entry through the command that committed it). While READs keep
//! coming, that entry gets some of them and the main thread's entries the
//! others, and the two threads serve two READs at once. It holds one entry
//! at most: every entry it committed would stay with it, and with two it
//! got both READs in flight and served them in turn (the helper 70% of
//! the READs, 1.7–2.1 GB/s, against 2.1–2.6 holding one). Any other
//! request that reaches the entry it holds is forwarded to the main
//! thread, which serves it and commits from the main ring: the entry is
//! back, and the requests after it find it there. A small request pays one
//! wake-up more once after a burst of large reads, not one each.
//!
//! That a commit may come from another io_uring is how
//! `fuse_uring_commit_fetch` works (it finds the entry by the request's
//! `unique` and keeps the new command), not a promise of the kernel's: a
//! kernel that refused it would fail the helper's first commit, and then
//! the main thread commits that reply and the helper stops.

use std::io;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::thread::JoinHandle;

use log::debug;
use parking_lot::Mutex;

use super::{
    Entry, MAX_ENTRIES, ON_RING, Port, Ring, Shared, WAKE, arm_wake, ended, eventfd, large_read, pin,
};
use crate::Filesystem;

/// Large READs served by helpers, and requests they forwarded to their
/// main threads, all rings of the process.
static HELPER_READS: AtomicU64 = AtomicU64::new(0);
static HELPER_FORWARDED: AtomicU64 = AtomicU64::new(0);

/// What the rings' helper threads did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RingHelpers {
    /// Large READs a helper served, each beside what its main thread
    /// served meanwhile.
    pub reads: u64,
    /// Other requests that reached an entry a helper held, served by the
    /// main thread (each one wake-up more).
    pub forwarded: u64,
}

/// The rings' helpers since the process started.
pub fn ring_helpers() -> RingHelpers {
    RingHelpers {
        reads: HELPER_READS.load(Ordering::Relaxed),
        forwarded: HELPER_FORWARDED.load(Ordering::Relaxed),
    }
}

/// What a queue's main thread shares with its helper.
pub(super) struct HelperShared {
    /// Entries the main thread handed over, their requests accepted.
    todo: Mutex<Vec<usize>>,
    wake: OwnedFd,
    /// Its ring is up: it may be handed READs.
    ready: AtomicBool,
    /// Entries it holds (`Entry::at_helper`): the main thread hands it a
    /// READ only when it holds none.
    holds: AtomicUsize,
    stopped: AtomicBool,
}

impl HelperShared {
    pub(super) fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
        self.wake();
    }

    fn wake(&self) {
        super::wake(&self.wake);
    }
}

/// Hands the large READ in entry `idx` (accepted) to the queue's helper
/// if it holds no entry; whether it took it.
pub(super) fn hand(shared: &Shared, idx: usize) -> bool {
    let Some(h) = shared.helper.get() else {
        return false;
    };
    // Under the lock under which the helper clears `ready` as it stops.
    let mut todo = h.todo.lock();
    if !h.ready.load(Ordering::Acquire)
        || h.holds
            .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
    {
        return false;
    }
    shared.entries.lock()[idx]
        .at_helper
        .store(true, Ordering::Release);
    todo.push(idx);
    drop(todo);
    h.wake();
    true
}

/// Entry `e` was committed from the helper's ring (`helper`) or the main
/// thread's: counts what the helper holds.
pub(super) fn held(shared: &Shared, e: &Entry, helper: bool) {
    let Some(h) = shared.helper.get() else {
        return;
    };
    if e.at_helper.swap(helper, Ordering::AcqRel) != helper {
        if helper {
            h.holds.fetch_add(1, Ordering::AcqRel);
        } else {
            h.holds.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Has the main thread commit entry `idx`, whose reply the helper wrote
/// and could not commit: busy again until it is.
fn give_back(shared: &Shared, idx: usize) {
    let Some(e) = shared.entries.lock().get(idx).cloned() else {
        return;
    };
    shared.busy.fetch_add(1, Ordering::Relaxed);
    if !e.pollable.load(Ordering::Relaxed) {
        shared.unpollable.fetch_add(1, Ordering::Relaxed);
    }
    shared.post(idx, None);
}

/// Starts the helper of `port`'s queue, whose main thread runs.
pub(super) fn spawn<FS: Filesystem + 'static>(
    port: Port<FS>,
    cpus: usize,
) -> io::Result<JoinHandle<()>> {
    let me = Arc::new(HelperShared {
        todo: Mutex::new(Vec::new()),
        wake: eventfd()?,
        ready: AtomicBool::new(false),
        holds: AtomicUsize::new(0),
        stopped: AtomicBool::new(false),
    });
    if port.shared.0.helper.set(me.clone()).is_err() {
        return Err(io::Error::other("the queue has a helper already"));
    }
    let qid = port.qid;
    let h = Helper {
        port,
        me,
        cpus,
        wake_buf: Box::new(0),
    };
    std::thread::Builder::new()
        .name(format!("fuse-ring-{qid}h"))
        .spawn(move || h.run())
}

struct Helper<FS: Filesystem> {
    port: Port<FS>,
    me: Arc<HelperShared>,
    cpus: usize,
    wake_buf: Box<u64>,
}

impl<FS: Filesystem + 'static> Helper<FS> {
    fn run(mut self) {
        let qid = self.port.qid;
        // It stays on the queue's CPU; the main thread moves off it for
        // the large READs it serves itself (see `MOVE_READS_FROM`).
        pin(qid as usize, self.cpus, true);
        let mut ring = match Ring::builder().build(2 * MAX_ENTRIES as u32) {
            Ok(r) => r,
            Err(e) => {
                debug!("fuse ring {qid}: no helper: {e}");
                return;
            }
        };
        if let Err(e) = self.serve(&mut ring) {
            log::error!("fuse ring {qid} helper: {e}");
        }
        // READs handed over as it stopped go back to the main thread.
        let left: Vec<usize> = {
            let mut todo = self.me.todo.lock();
            self.me.ready.store(false, Ordering::Release);
            todo.drain(..).collect()
        };
        if !left.is_empty() {
            let shared = &self.port.shared.0;
            shared.forwarded.lock().extend(left);
            shared.wake();
        }
    }

    fn serve(&mut self, ring: &mut Ring) -> io::Result<()> {
        let shared = self.port.shared.clone();
        let shared = &shared.0;
        ON_RING.with(|r| r.borrow_mut().0 = Arc::as_ptr(&self.port.shared) as usize);
        arm_wake(ring, &self.me.wake, &mut self.wake_buf)?;
        ring.submit()?;
        self.me.ready.store(true, Ordering::Release);
        loop {
            match ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                Err(e) => return Err(e),
            }
            if self.me.stopped.load(Ordering::Acquire) || shared.stopped.load(Ordering::Acquire) {
                return Ok(());
            }
            let cqes: Vec<_> = ring
                .completion()
                .map(|c| (c.user_data(), c.result()))
                .collect();
            let mut reads = Vec::new();
            for (ud, res) in cqes {
                if ud == WAKE {
                    reads.append(&mut self.me.todo.lock());
                    arm_wake(ring, &self.me.wake, &mut self.wake_buf)?;
                    continue;
                }
                let idx = ud as usize;
                match ended(self.port.qid, res) {
                    Ok(false) => {}
                    Ok(true) => return Ok(()),
                    Err(e) => {
                        // Its commit was refused (a kernel that takes
                        // commits only from the io_uring that registered
                        // the entry would): the reply is still in the
                        // entry, so the main thread commits it, and the
                        // helper stops.
                        give_back(shared, idx);
                        return Err(e);
                    }
                }
                // An entry it committed has the next request.
                let (op, size) = shared.accept(idx);
                if large_read(op, size) {
                    reads.push(idx);
                } else {
                    HELPER_FORWARDED.fetch_add(1, Ordering::Relaxed);
                    shared.forwarded.lock().push(idx);
                    shared.wake();
                }
            }
            for idx in reads {
                HELPER_READS.fetch_add(1, Ordering::Relaxed);
                self.port.dispatch(idx);
                // Replies sent during dispatch are committed from this
                // ring; one sent later by another thread goes to the main
                // thread's mailbox, and it commits it.
                let local = ON_RING.with(|r| std::mem::take(&mut r.borrow_mut().1));
                for (idx, copy) in local {
                    self.port.commit(ring, idx, copy, true)?;
                }
                ring.submit()?;
            }
        }
    }
}

