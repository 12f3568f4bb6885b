//! FUSE over io_uring (Linux 6.14 and later, with the `fuse` module's
//! `enable_uring` parameter set): requests reach the daemon through one
//! io_uring per CPU instead of `read(2)` on `/dev/fuse`.
//!
//! Why: with `/dev/fuse` every request wakes a daemon thread wherever it
//! last ran, and every reply wakes the caller wherever it waits; on a
//! virtual machine each of those is a cross-CPU interrupt and the wake-up
//! of a halted vCPU, which costs more than the filesystem's own work for a
//! metadata request. Over io_uring the kernel queues a request on the ring
//! of the CPU the caller runs on, and that ring's thread runs pinned to
//! that CPU: request and reply are local wake-ups. With more than one
//! CPU, each queue also has a helper thread for large READs ([`helper`]).
//!
//! The protocol (`fs/fuse/dev_uring.c`): each ring entry registers a
//! header buffer ([`ReqHeader`]) and a payload buffer with the kernel
//! (`FUSE_IO_URING_CMD_REGISTER`); the kernel completes the command when a
//! request is in the buffers (the `fuse_in_header` and the operation's
//! first argument in the header, the rest in the payload); the daemon
//! writes the reply into the same buffers and hands the entry back with
//! `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`, which also waits for the next
//! request. Every queue of every possible CPU must register an entry
//! before the kernel switches to the rings; until then, and for `FORGET`,
//! `INTERRUPT` and notifications always, `/dev/fuse` is used as before.
//!
//! A request is rebuilt in the classic layout in front of its payload (the
//! header and first argument copied, the payload where the kernel put it)
//! and dispatched as any other; its reply, from whichever thread sends it,
//! goes into the entry's buffers, and a thread that owns an io_uring
//! commits it (io_uring commands run in the context of the thread that
//! submits them): the queue's main thread, or its helper for the READs
//! the helper served itself. Entries are added while most
//! are busy (requests that wait: lease queues, fsyncs), so a waiting
//! request never holds up the others of its CPU.
//!
//! A reply another thread owes (an fsync's, after the disk) wakes the
//! ring's thread across CPUs, and on a VM whose idle vCPUs halt in the
//! host that wake-up is a round trip through the host (50–90 µs measured
//! on a 4 KiB append + fsync of 150–200 µs). So while such a reply is
//! owed, the thread polls for it a while before it sleeps ([`Poll`]), as
//! the kernel's `haltpoll` idle driver would if the VM had it set.

use std::cell::{RefCell, UnsafeCell};
use std::io;
use std::io::IoSlice;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use io_uring::{IoUring, cqueue, opcode, squeue, types};
use log::{debug, error, warn};
use parking_lot::Mutex;

use crate::Filesystem;
use crate::channel::{Channel, ChannelSender};
use crate::ll;
use crate::reply::ReplySender;
use crate::request::RequestWithSender;
use crate::session::SessionEventLoop;

mod helper;
pub use helper::{RingHelpers, ring_helpers};

const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;
/// `sizeof(struct fuse_in_header)`.
const IN_HEADER: usize = 40;
/// `sizeof(struct fuse_out_header)`.
const OUT_HEADER: usize = 16;
/// Room in front of the payload for the header and first argument of the
/// classic layout (at most 40 + 128 bytes), kept 8-byte aligned.
const SLACK: usize = 256;
/// Entries each queue starts with and keeps free at least (or as many as
/// are busy, whichever is more), added `GROW_BY` at a time, up to
/// `MAX_ENTRIES`. A request that finds no free entry waits in the kernel
/// until some entry is committed (registering a new one does not fetch
/// it), so a queue never lets its busy entries use up the free ones:
/// requests that wait long (an open queued for a lease) must not hold up
/// the one that would end their wait.
const START: usize = 16;
const GROW_BY: usize = 16;
const MAX_ENTRIES: usize = 1024;
/// READs of at least this many bytes are served with the ring's thread
/// moved off its CPU, onto the others; it stays there while large READs
/// keep coming and goes back after a batch without one. The kernel queues
/// a request on the ring of the CPU that issued it, and a reader that
/// reads ahead keeps that CPU busy copying the previous request's pages:
/// served there, the large read waits for it, with the other CPUs idle (a
/// daemon-served 1 GiB sequential read measured 1.2–1.5 GB/s pinned
/// against 2.0–2.4 moved, on 2 vCPUs). Going home after every batch cost
/// two migrations per 1 MiB READ (1,686–2,081 MB/s against 1,796–2,205
/// staying, 6 rounds each, the file's pages dropped and the replicas in
/// memory). Small requests stay on the issuer's CPU, where the ring saves
/// them a cross-CPU wake-up each way. A large READ's reply is committed
/// as soon as it is written, not after the rest of its batch, so the
/// reader does not wait for the next READ of the batch. The queue's
/// helper serves such READs too, on the issuer's CPU ([`helper`]).
const MOVE_READS_FROM: u32 = 256 << 10;
/// `user_data` of the eventfd read; entries use their index.
const WAKE: u64 = u64::MAX;

/// Polling is for a caller that waits for the disk with nothing else
/// to do: at most this many requests owed on the ring, each a sync or a
/// close. A WRITE held by back-pressure, or many closes of many writers,
/// owe their replies to workers that need the CPUs themselves; polling
/// then took a CPU from them (1,000 writers of 1 MiB: 0.5x).
const POLL_AT_MOST_OWED: usize = 2;

/// Whether a request (opcode `op`, first argument's `size`) is a READ of
/// at least [`MOVE_READS_FROM`].
fn large_read(op: u32, size: u32) -> bool {
    op == ll::fuse_abi::fuse_opcode::FUSE_READ as u32 && size >= MOVE_READS_FROM
}

/// Whether a request of opcode `op` is one a ring's thread polls for.
fn polled_for(op: u32) -> bool {
    use ll::fuse_abi::fuse_opcode::*;
    [
        FUSE_FSYNC as u32,
        FUSE_FSYNCDIR as u32,
        FUSE_FLUSH as u32,
        FUSE_RELEASE as u32,
    ]
    .contains(&op)
}

/// The shortest poll once polling paid (`haltpoll`'s `grow_start`).
const POLL_START: Duration = Duration::from_micros(50);

/// Polls for owed replies, all rings of the process: `answered` found the
/// reply (or a new request) while polling, `missed` went to sleep after.
static POLLS_ANSWERED: AtomicU64 = AtomicU64::new(0);
static POLLS_MISSED: AtomicU64 = AtomicU64::new(0);

/// What the rings' threads did while replies were owed to them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RingPolls {
    /// Polls that found what they waited for: each a sleep and a
    /// cross-CPU wake-up saved.
    pub answered: u64,
    /// Polls that gave up and slept.
    pub missed: u64,
}

/// The rings' polls since the process started.
pub fn ring_polls() -> RingPolls {
    RingPolls {
        answered: POLLS_ANSWERED.load(Ordering::Relaxed),
        missed: POLLS_MISSED.load(Ordering::Relaxed),
    }
}

/// How long a ring's thread polls before it sleeps, adapted as the
/// kernel's `haltpoll` does: a wait that ended within `max` but after the
/// current poll grows it (doubling, from [`POLL_START`]); one that ended
/// beyond `max` halves it, so waits that are long anyway (a lease queue, a
/// large fsync, back-pressure) soon cost no polling at all.
struct Poll {
    max: Duration,
    now: Duration,
}

impl Poll {
    fn new(max: Duration) -> Poll {
        Poll { max, now: max }
    }

    /// A wait (polled, then slept) took `waited` in all.
    fn waited(&mut self, waited: Duration) {
        if waited > self.max {
            self.now /= 2;
            if self.now < POLL_START {
                self.now = Duration::ZERO;
            }
        } else if waited > self.now {
            self.now = (self.now * 2).max(POLL_START).min(self.max);
        }
    }
}

/// A reply waiting to be committed: its entry, and the reply itself when
/// it was copied aside rather than written into the entry.
type Pending = (usize, Option<Vec<u8>>);

thread_local! {
    /// On a ring's thread: which queue it serves, and the replies sent
    /// from this thread while it dispatched (committed once dispatch
    /// returns, without waking anybody).
    static ON_RING: RefCell<(usize, Vec<Pending>)> = const { RefCell::new((0, Vec::new())) };
}

/// `struct fuse_uring_ent_in_out`.
#[repr(C)]
#[derive(Default)]
struct EntInOut {
    flags: u64,
    commit_id: u64,
    payload_sz: u32,
    padding: u32,
    reserved: u64,
}

/// `struct fuse_uring_req_header`: in_out holds the `fuse_in_header` of a
/// request, then the `fuse_out_header` of its reply; op_in the request's
/// first argument.
#[repr(C, align(8))]
struct ReqHeader {
    in_out: [u8; 128],
    op_in: [u8; 128],
    ent: EntInOut,
}

/// `struct fuse_uring_cmd_req`, at the start of the SQE's command area.
fn cmd_req(qid: u16, commit_id: u64) -> [u8; 80] {
    let mut c = [0u8; 80];
    c[8..16].copy_from_slice(&commit_id.to_ne_bytes());
    c[16..18].copy_from_slice(&qid.to_ne_bytes());
    c
}

/// The buffers of one ring entry, shared by the ring's thread and the
/// thread that replies. The kernel reads and writes them between a
/// register or commit and the completion that hands them back. Then the
/// ring's thread copies the request's header and first argument in front
/// of the payload (`[start, SLACK)`) and dispatches it, the request
/// borrowing `[start, SLACK + its payload)`; a reply goes into the header
/// area (the `fuse_out_header`) and the payload area (`[SLACK, ...)`). A
/// reply may be written while the request is still being dispatched only
/// when the two do not meet: the request had no payload (see
/// [`Entry::req_payload`]); otherwise it is copied aside until dispatch is
/// over. All access goes through raw pointers to exactly those ranges.
struct Entry {
    header: UnsafeCell<ReqHeader>,
    /// `SLACK` bytes, then the payload buffer the kernel knows; never
    /// resized, so `base` stays valid.
    _buf: Vec<u8>,
    base: *mut u8,
    max_payload: usize,
    /// The iovecs given to the kernel at registration.
    iov: UnsafeCell<[libc::iovec; 2]>,
    /// The ring's thread is dispatching this entry's request.
    dispatching: AtomicBool,
    /// The payload bytes of the request being dispatched (what it borrows
    /// past `SLACK`).
    req_payload: AtomicU32,
    /// The `unique` of the request the entry holds.
    unique: AtomicU32Pair,
    /// The request it holds is of a kind polled for (`polled_for`).
    pollable: AtomicBool,
    /// Its next request completes on the queue's helper's io_uring, or
    /// the helper serves it (see [`helper`]).
    at_helper: AtomicBool,
}

// SAFETY: the buffers behind the `UnsafeCell`s and `base` are handed
// between threads by the protocol above (completion, dispatch flag,
// mailbox); no two ever use the same bytes at once.
unsafe impl Sync for Entry {}
unsafe impl Send for Entry {}

/// A u64 stored as two atomics (no 64-bit atomics needed).
#[derive(Default)]
struct AtomicU32Pair(AtomicU32, AtomicU32);

impl AtomicU32Pair {
    fn set(&self, v: u64) {
        self.0.store(v as u32, Ordering::Relaxed);
        self.1.store((v >> 32) as u32, Ordering::Release);
    }
    fn get(&self) -> u64 {
        let hi = self.1.load(Ordering::Acquire) as u64;
        (hi << 32) | self.0.load(Ordering::Relaxed) as u64
    }
}

impl Entry {
    fn new(max_payload: usize) -> Arc<Entry> {
        // Zeroed large allocations are fresh pages, touched only as
        // payloads use them.
        let mut buf = vec![0u8; SLACK + max_payload];
        let base = buf.as_mut_ptr();
        let e = Arc::new(Entry {
            header: UnsafeCell::new(ReqHeader {
                in_out: [0; 128],
                op_in: [0; 128],
                ent: EntInOut::default(),
            }),
            _buf: buf,
            base,
            max_payload,
            iov: UnsafeCell::new(
                [libc::iovec {
                    iov_base: std::ptr::null_mut(),
                    iov_len: 0,
                }; 2],
            ),
            dispatching: AtomicBool::new(false),
            req_payload: AtomicU32::new(0),
            unique: AtomicU32Pair::default(),
            pollable: AtomicBool::new(false),
            at_helper: AtomicBool::new(false),
        });
        // SAFETY: nobody else has the entry yet; `base` points into a
        // buffer of SLACK + max_payload bytes.
        unsafe {
            let iov = &mut *e.iov.get();
            iov[0].iov_base = e.header.get().cast();
            iov[0].iov_len = std::mem::size_of::<ReqHeader>();
            iov[1].iov_base = base.add(SLACK).cast();
            iov[1].iov_len = max_payload;
        }
        e
    }

    /// The opcode of the request the entry holds, and the `size` of its
    /// first argument (a READ's length). Only while the entry is busy and
    /// not dispatched yet.
    fn opcode(&self) -> (u32, u32) {
        // SAFETY: the kernel handed the entry back; only the thread that
        // took it reads it.
        let h = unsafe { &*self.header.get() };
        let op = u32::from_ne_bytes([h.in_out[4], h.in_out[5], h.in_out[6], h.in_out[7]]);
        let size = u32::from_ne_bytes([h.op_in[16], h.op_in[17], h.op_in[18], h.op_in[19]]);
        (op, size)
    }

    /// Whether a reply may be written into the buffers now (see [`Entry`]).
    fn reply_fits(&self) -> bool {
        !self.dispatching.load(Ordering::Acquire) || self.req_payload.load(Ordering::Acquire) == 0
    }

    /// The payload area, for a reply of `len` bytes written in place.
    /// Only while [`Entry::reply_fits`], or after dispatch.
    #[allow(clippy::mut_from_ref)]
    unsafe fn payload(&self, len: usize) -> &mut [u8] {
        // SAFETY: `[SLACK, SLACK + max_payload)` lies in the buffer, and
        // the caller holds the reply, the area's only user now.
        unsafe { std::slice::from_raw_parts_mut(self.base.add(SLACK), len.min(self.max_payload)) }
    }

    /// Writes a reply's `fuse_out_header` whose `payload` bytes are
    /// already in the payload area. As [`Entry::payload`].
    unsafe fn put_header(&self, header: &[u8], payload: usize) {
        let h = self.header.get();
        let n = header.len().min(OUT_HEADER);
        // SAFETY: within `in_out` (128 bytes) and a field of the header
        // the request does not borrow.
        unsafe {
            std::ptr::copy_nonoverlapping(header.as_ptr(), (&raw mut (*h).in_out).cast::<u8>(), n);
            (*h).ent.payload_sz = payload.min(self.max_payload) as u32;
        }
    }

    /// Writes a reply (`fuse_out_header`, then its payload) into the
    /// buffers. Only while [`Entry::reply_fits`], or after dispatch.
    unsafe fn put_reply(&self, reply: &[IoSlice<'_>]) {
        let h = self.header.get();
        let mut head = 0;
        let mut at = 0;
        for s in reply {
            let mut s: &[u8] = s;
            if head < OUT_HEADER {
                let n = (OUT_HEADER - head).min(s.len());
                // SAFETY: within `in_out` (128 bytes); the request's copy
                // of its header lives in the buffer, not here.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        s.as_ptr(),
                        (&raw mut (*h).in_out).cast::<u8>().add(head),
                        n,
                    )
                };
                head += n;
                s = &s[n..];
            }
            let n = s.len().min(self.max_payload - at);
            // SAFETY: within the payload area, which the request does not
            // borrow (see `reply_fits`).
            unsafe { std::ptr::copy_nonoverlapping(s.as_ptr(), self.base.add(SLACK + at), n) };
            at += n;
        }
        // SAFETY: a field of the header the request does not borrow.
        unsafe { (*h).ent.payload_sz = at as u32 };
    }
}

/// What the threads replying to requests share with a ring's thread.
struct Shared {
    /// Entries whose reply is in their buffers, to be committed; and
    /// replies copied aside because they came during dispatch.
    mailbox: Mutex<Vec<Pending>>,
    /// Wakes the ring's thread for its mailbox.
    wake: OwnedFd,
    /// The ring's thread polls the mailbox: no wake-up needed. Read, and
    /// cleared, under the mailbox's lock (see `Queue::poll_owed`).
    polling: AtomicBool,
    /// The ring's thread has stopped: replies go nowhere.
    stopped: AtomicBool,
    /// Every entry of the queue, by index (grows, never shrinks).
    entries: Mutex<Vec<Arc<Entry>>>,
    /// Entries handed to userspace and not committed yet, by either
    /// thread of the queue.
    busy: AtomicUsize,
    /// Busy entries whose request is not of a kind polled for.
    unpollable: AtomicUsize,
    /// Requests the queue's helper took from an entry and hands to the
    /// main thread (see [`helper`]).
    forwarded: Mutex<Vec<usize>>,
    /// The queue's helper, once it runs.
    helper: std::sync::OnceLock<Arc<helper::HelperShared>>,
}

impl Shared {
    /// An entry came back from the kernel with a request: it is busy until
    /// committed. Its opcode and first argument's `size`.
    fn accept(&self, idx: usize) -> (u32, u32) {
        let e = self.entries.lock()[idx].clone();
        let (op, size) = e.opcode();
        let pollable = polled_for(op);
        e.pollable.store(pollable, Ordering::Relaxed);
        self.busy.fetch_add(1, Ordering::Relaxed);
        if !pollable {
            self.unpollable.fetch_add(1, Ordering::Relaxed);
        }
        (op, size)
    }

    /// Wakes the ring's thread (a reply or a request for it).
    fn wake(&self) {
        wake(&self.wake);
    }

    fn post(&self, idx: usize, copy: Option<Vec<u8>>) {
        let wake = {
            let mut m = self.mailbox.lock();
            m.push((idx, copy));
            m.len() == 1 && !self.polling.load(Ordering::Relaxed)
        };
        if wake {
            self.wake();
        }
    }
}

/// Where a reply to a request that came through a ring goes.
#[derive(Clone, Debug)]
pub(crate) struct RingSender {
    shared: Arc<SharedHandle>,
    entry: Arc<EntryHandle>,
    idx: usize,
    /// `/dev/fuse`, for what only it takes (passthrough backing files).
    pub(crate) ch: ChannelSender,
}

/// `Debug` wrappers (the shared state has raw buffers in it).
struct SharedHandle(Shared);
struct EntryHandle(Arc<Entry>);

impl std::fmt::Debug for SharedHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ring queue")
    }
}
impl std::fmt::Debug for EntryHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ring entry")
    }
}

impl RingSender {
    pub(crate) fn send(&self, reply: &[IoSlice<'_>]) -> io::Result<()> {
        let shared = &self.shared.0;
        if shared.stopped.load(Ordering::Acquire) {
            return Err(io::Error::from_raw_os_error(libc::ENOTCONN));
        }
        let e = &self.entry.0;
        let pending = if e.reply_fits() {
            // SAFETY: the kernel waits for this reply and the request, if
            // still being dispatched, borrows nothing it writes.
            unsafe { e.put_reply(reply) };
            None
        } else {
            // Dispatch of this very request is still on the stack, its
            // payload borrowed from the buffer: copy the reply aside.
            let mut copy = Vec::with_capacity(reply.iter().map(|s| s.len()).sum());
            for s in reply {
                copy.extend_from_slice(s);
            }
            Some(copy)
        };
        self.deliver(pending);
        Ok(())
    }

    /// The entry's payload area for a reply of up to `len` bytes written
    /// in place, sparing the copy [`RingSender::send`] makes: `None` when
    /// it is too small, or the request being dispatched still borrows it.
    /// The caller holds the reply: nothing else uses the area until it is
    /// sent.
    #[allow(clippy::mut_from_ref)]
    pub(crate) fn lend(&self, len: usize) -> Option<&mut [u8]> {
        let e = &self.entry.0;
        if len > e.max_payload || !e.reply_fits() {
            return None;
        }
        // SAFETY: see above; `reply_fits` holds until the reply is sent.
        Some(unsafe { e.payload(len) })
    }

    /// Sends the reply whose `n` payload bytes [`RingSender::lend`]'s area
    /// holds, under `header`.
    pub(crate) fn send_lent(&self, header: &[u8], n: usize) -> io::Result<()> {
        if self.shared.0.stopped.load(Ordering::Acquire) {
            return Err(io::Error::from_raw_os_error(libc::ENOTCONN));
        }
        // SAFETY: as in `lend`: the request borrows nothing of the entry.
        unsafe { self.entry.0.put_header(header, n) };
        self.deliver(None);
        Ok(())
    }

    /// Has the ring's thread commit the reply in the entry's buffers (or
    /// `pending`, a copy of it).
    fn deliver(&self, pending: Option<Vec<u8>>) {
        let shared = &self.shared.0;
        // From the ring's own thread it is committed once dispatch
        // returns; from any other, the ring's thread is woken for it.
        let me = Arc::as_ptr(&self.shared) as usize;
        let pending = ON_RING.with(|r| {
            let mut r = r.borrow_mut();
            if r.0 == me {
                r.1.push((self.idx, pending));
                None
            } else {
                Some(pending)
            }
        });
        if let Some(p) = pending {
            shared.post(self.idx, p);
        }
    }
}

/// The rings of a session, one per possible CPU.
pub(crate) struct Rings {
    threads: Vec<JoinHandle<()>>,
    shared: Vec<Arc<SharedHandle>>,
}

impl Rings {
    /// Stops every ring's thread and waits for them.
    pub(crate) fn stop(self) {
        for s in &self.shared {
            s.0.stopped.store(true, Ordering::Release);
            s.0.wake();
            if let Some(h) = s.0.helper.get() {
                h.stop();
            }
        }
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// The CPUs the kernel may have: it keeps one queue for each.
fn possible_cpus() -> io::Result<usize> {
    let s = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    let mut n = 0;
    for part in s.trim().split(',') {
        let last = part.rsplit('-').next().unwrap_or(part);
        let last: usize = last
            .parse()
            .map_err(|_| io::Error::other(format!("cannot read possible CPUs from {s:?}")))?;
        n = n.max(last + 1);
    }
    Ok(n)
}

/// Starts a ring for each possible CPU. `max_payload` is what the kernel
/// wants of a payload buffer (`max(8 KiB, max_write, max_pages pages)`).
pub(crate) fn start<FS: Filesystem + 'static>(
    se: Arc<SessionEventLoop<FS>>,
    ch: &Channel,
    max_payload: usize,
    poll: Duration,
) -> io::Result<Rings> {
    let cpus = possible_cpus()?;
    let mut threads = Vec::new();
    let mut shareds = Vec::new();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<io::Result<()>>();
    let port = |qid: usize, shared: &Arc<SharedHandle>| Port {
        qid: qid as u16,
        se: se.clone(),
        dev: ch.as_fd().as_raw_fd(),
        sender: ch.sender(),
        shared: shared.clone(),
        max_payload,
    };
    for qid in 0..cpus {
        let shared = Arc::new(SharedHandle(Shared {
            mailbox: Mutex::new(Vec::new()),
            wake: eventfd()?,
            polling: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
            entries: Mutex::new(Vec::new()),
            busy: AtomicUsize::new(0),
            unpollable: AtomicUsize::new(0),
            forwarded: Mutex::new(Vec::new()),
            helper: std::sync::OnceLock::new(),
        }));
        let q = Queue {
            port: port(qid, &shared),
            cpus,
            poll: Poll::new(poll),
            wake_buf: Box::new(0),
            early: Vec::new(),
        };
        let ready = ready_tx.clone();
        threads.push(
            std::thread::Builder::new()
                .name(format!("fuse-ring-{qid}"))
                .spawn(move || q.run(ready))?,
        );
        shareds.push(shared);
    }
    drop(ready_tx);
    let mut rings = Rings {
        threads,
        shared: shareds,
    };
    // Every queue registered its first entries, or one could not.
    for _ in 0..cpus {
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                rings.stop();
                return Err(e);
            }
            Err(_) => {
                rings.stop();
                return Err(io::Error::other("a fuse ring thread ended at its start"));
            }
        }
    }
    // With more than one CPU, each queue gets a helper (see [`helper`]);
    // a queue without one serves as before.
    if cpus > 1 {
        for qid in 0..cpus {
            let shared = rings.shared[qid].clone();
            match helper::spawn(port(qid, &shared), cpus) {
                Ok(t) => rings.threads.push(t),
                Err(e) => debug!("fuse ring {qid}: no helper: {e}"),
            }
        }
    }
    Ok(rings)
}

/// Wakes the thread whose ring reads the eventfd `fd`.
fn wake(fd: &OwnedFd) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a local to an eventfd we own.
    let r = unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    if r != 8 {
        warn!(
            "fuse ring: cannot wake a ring's thread: {}",
            io::Error::last_os_error()
        );
    }
}

/// A new eventfd, to wake a thread through its ring.
fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: eventfd(2) with valid flags; the result is checked.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// What both threads of a queue (the main thread and its helper) need to
/// serve its entries and hand them back.
struct Port<FS: Filesystem> {
    qid: u16,
    se: Arc<SessionEventLoop<FS>>,
    dev: RawFd,
    sender: ChannelSender,
    shared: Arc<SharedHandle>,
    max_payload: usize,
}

/// One CPU's ring and its main thread's state.
struct Queue<FS: Filesystem> {
    port: Port<FS>,
    /// The possible CPUs (one queue each).
    cpus: usize,
    /// How long to poll for an owed reply before sleeping.
    poll: Poll,
    /// Where the eventfd read lands.
    wake_buf: Box<u64>,
    /// Completions found while starting, served first.
    early: Vec<(u64, i32)>,
}

type Ring = IoUring<squeue::Entry128, cqueue::Entry>;

impl<FS: Filesystem + 'static> Queue<FS> {
    fn run(mut self, ready: std::sync::mpsc::Sender<io::Result<()>>) {
        let cpu = self.port.qid as usize;
        if !pin(cpu, self.cpus, true) {
            // A CPU that is possible but not online cannot be pinned to;
            // its queue still has to exist for the kernel to use the rings.
            debug!("fuse ring {cpu}: not pinned");
        }
        let mut ring = match Ring::builder().build(2 * MAX_ENTRIES as u32) {
            Ok(r) => r,
            Err(e) => {
                let _ = ready.send(Err(e));
                return;
            }
        };
        // A registration the kernel refuses completes at once, in the
        // submit: its error is the ring's. (Anything else already there
        // is served first.)
        let mut early = Vec::new();
        let started = self
            .grow(&mut ring, START)
            .and_then(|()| arm_wake(&mut ring, &self.port.shared.0.wake, &mut self.wake_buf))
            .and_then(|()| ring.submit().map(drop))
            .and_then(|()| {
                early = ring
                    .completion()
                    .map(|c| (c.user_data(), c.result()))
                    .collect();
                match early.iter().find(|(_, r)| *r < 0) {
                    Some((_, r)) => Err(io::Error::from_raw_os_error(-r)),
                    None => Ok(()),
                }
            });
        let failed = started.is_err();
        let _ = ready.send(started);
        if failed {
            return;
        }
        self.early = early;
        if let Err(e) = self.serve(&mut ring) {
            error!("fuse ring {cpu}: {e}");
        }
        self.port.shared.0.stopped.store(true, Ordering::Release);
    }

    /// Registers `n` more entries.
    fn grow(&mut self, ring: &mut Ring, n: usize) -> io::Result<()> {
        let mut entries = self.port.shared.0.entries.lock();
        let n = n.min(MAX_ENTRIES - entries.len());
        for _ in 0..n {
            let idx = entries.len();
            let e = Entry::new(self.port.max_payload);
            let sqe = opcode::UringCmd80::new(types::Fd(self.port.dev), CMD_REGISTER)
                .cmd(cmd_req(self.port.qid, 0))
                .addr(Some(e.iov.get() as u64))
                .build()
                .user_data(idx as u64);
            let sqe = with_len(sqe, 2);
            push(ring, &sqe)?;
            entries.push(e);
        }
        Ok(())
    }

    fn serve(&mut self, ring: &mut Ring) -> io::Result<()> {
        let shared = self.port.shared.clone();
        let shared = &shared.0;
        let mut local: Vec<Pending> = Vec::new();
        let mut moved = false;
        ON_RING.with(|r| r.borrow_mut().0 = Arc::as_ptr(&self.port.shared) as usize);
        loop {
            // Completions found at the start are served before waiting;
            // a reply owed by another thread is polled for a while.
            let mut want = if self.early.is_empty() { 1 } else { 0 };
            let busy = shared.busy.load(Ordering::Relaxed);
            let owed = (want == 1
                && (1..=POLL_AT_MOST_OWED).contains(&busy)
                && shared.unpollable.load(Ordering::Relaxed) == 0)
                .then(Instant::now);
            if owed.is_some() && !self.poll.now.is_zero() {
                ring.submit()?;
                if self.poll_owed(ring) {
                    want = 0;
                }
            }
            match ring.submit_and_wait(want) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                Err(e) => return Err(e),
            }
            if let Some(t) = owed {
                self.poll.waited(t.elapsed());
            }
            if shared.stopped.load(Ordering::Acquire) {
                return Ok(());
            }
            // Replies posted while it polled came without a wake-up.
            local.append(&mut shared.mailbox.lock());
            let mut large = false;
            let mut cqes = std::mem::take(&mut self.early);
            cqes.extend(ring.completion().map(|c| (c.user_data(), c.result())));
            let mut todo = Vec::with_capacity(cqes.len());
            for (ud, res) in cqes {
                if ud == WAKE {
                    local.append(&mut shared.mailbox.lock());
                    arm_wake(ring, &shared.wake, &mut self.wake_buf)?;
                    // Requests the helper found on entries it held.
                    todo.extend(shared.forwarded.lock().drain(..).map(|idx| (idx, None)));
                    continue;
                }
                if ended(self.port.qid, res)? {
                    return Ok(());
                }
                let idx = ud as usize;
                todo.push((idx, Some(shared.accept(idx))));
            }
            for (idx, kind) in todo {
                let (op, size) = match kind {
                    Some(k) => k,
                    None => self.port.opcode(idx),
                };
                let is_large = large_read(op, size);
                if is_large && helper::hand(shared, idx) {
                    continue;
                }
                // A large read is served off the reader's CPU (see
                // `MOVE_READS_FROM`), its reply committed at once.
                if is_large && !moved {
                    moved = pin(self.port.qid as usize, self.cpus, false);
                }
                large |= is_large;
                self.port.dispatch(idx);
                ON_RING.with(|r| local.append(&mut r.borrow_mut().1));
                if is_large && !local.is_empty() {
                    for (idx, copy) in local.drain(..) {
                        self.port.commit(ring, idx, copy, false)?;
                    }
                    ring.submit()?;
                }
            }
            for (idx, copy) in local.drain(..) {
                self.port.commit(ring, idx, copy, false)?;
            }
            // Home after a batch without a large READ.
            if moved && !large {
                ring.submit()?;
                pin(self.port.qid as usize, self.cpus, true);
                moved = false;
            }
            let busy = shared.busy.load(Ordering::Relaxed);
            let free = shared.entries.lock().len().saturating_sub(busy);
            let want = START.max(busy);
            if free < want {
                let n = (want - free).div_ceil(GROW_BY) * GROW_BY;
                self.grow(ring, n)?;
            }
        }
    }

    /// Polls for up to `self.poll.now` for a completion or a reply in the
    /// mailbox; whether one came. The thread yields at every turn, so a
    /// task runnable on its CPU is not held up; posts made meanwhile skip
    /// the eventfd (`Shared::polling`).
    fn poll_owed(&mut self, ring: &mut Ring) -> bool {
        let shared = &self.port.shared.0;
        shared.polling.store(true, Ordering::Relaxed);
        let start = Instant::now();
        let mut found = false;
        while !found && start.elapsed() < self.poll.now {
            std::thread::yield_now();
            found = !ring.completion().is_empty() || !shared.mailbox.lock().is_empty();
        }
        {
            // Under the lock, so that a post either saw `polling` and left
            // its reply for this check, or wakes the thread.
            let m = shared.mailbox.lock();
            shared.polling.store(false, Ordering::Relaxed);
            found |= !m.is_empty();
        }
        let counter = if found {
            &POLLS_ANSWERED
        } else {
            &POLLS_MISSED
        };
        counter.fetch_add(1, Ordering::Relaxed);
        found
    }
}

/// Whether a completion's result `res` says the connection is gone
/// (unmounted, aborted); any other error is the ring's.
fn ended(qid: u16, res: i32) -> io::Result<bool> {
    if res >= 0 {
        return Ok(false);
    }
    let err = io::Error::from_raw_os_error(-res);
    match -res {
        libc::ENOTCONN | libc::ECONNABORTED | libc::ECANCELED | libc::ENODEV => {
            debug!("fuse ring {qid}: {err}");
            Ok(true)
        }
        _ => Err(err),
    }
}

/// Queues the read of `wake` (an eventfd) that wakes a thread.
fn arm_wake(ring: &mut Ring, wake: &OwnedFd, buf: &mut Box<u64>) -> io::Result<()> {
    let sqe = opcode::Read::new(
        types::Fd(wake.as_raw_fd()),
        (&mut **buf as *mut u64).cast(),
        8,
    )
    .build()
    .user_data(WAKE);
    push(ring, &squeue::Entry128::from(sqe))
}

/// Pins the calling thread to CPU `cpu` (`home`), or to every other of
/// `cpus`; false if that is not possible (one CPU, or not allowed).
fn pin(cpu: usize, cpus: usize, home: bool) -> bool {
    let mut set = nix::sched::CpuSet::new();
    let mut any = false;
    for c in 0..cpus {
        if (c == cpu) == home && set.set(c).is_ok() {
            any = true;
        }
    }
    any && nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).is_ok()
}

impl<FS: Filesystem + 'static> Port<FS> {
    /// The opcode of the request in entry `idx`, and the `size` of its
    /// first argument (a READ's length).
    fn opcode(&self, idx: usize) -> (u32, u32) {
        self.shared.0.entries.lock()[idx].opcode()
    }

    /// Rebuilds the request in entry `idx` in the classic layout, in front
    /// of its payload, and dispatches it. A reply sent during dispatch is
    /// copied into `local`.
    fn dispatch(&self, idx: usize) {
        let e = self.shared.0.entries.lock()[idx].clone();
        // SAFETY: the kernel handed the entry back with a request in it;
        // until its reply, only this thread touches the buffers. What the
        // request needs of the header is copied out before any reply.
        let (len, unique, payload, in_out, op_in) = unsafe {
            let h = &*e.header.get();
            (
                u32::from_ne_bytes([h.in_out[0], h.in_out[1], h.in_out[2], h.in_out[3]]) as usize,
                u64::from_ne_bytes(h.in_out[8..16].try_into().expect("8 bytes")),
                h.ent.payload_sz as usize,
                h.in_out,
                h.op_in,
            )
        };
        e.unique.set(unique);
        e.req_payload.store(payload as u32, Ordering::Release);
        e.dispatching.store(true, Ordering::Release);
        let first = len
            .checked_sub(IN_HEADER + payload)
            .filter(|&n| n <= op_in.len());
        let sender = ReplySender::Ring(RingSender {
            shared: self.shared.clone(),
            entry: Arc::new(EntryHandle(e.clone())),
            idx,
            ch: self.sender.clone(),
        });
        match first {
            Some(first) if payload <= self.max_payload => {
                let start = SLACK - IN_HEADER - first;
                // SAFETY: `[start, SLACK + payload)` lies in the buffer,
                // whose payload the kernel just wrote; no reply touches
                // `[start, SLACK)`, nor the payload while this borrows it.
                let data = unsafe {
                    let p = e.base.add(start);
                    std::ptr::copy_nonoverlapping(in_out.as_ptr(), p, IN_HEADER);
                    std::ptr::copy_nonoverlapping(op_in.as_ptr(), p.add(IN_HEADER), first);
                    std::slice::from_raw_parts(p, SLACK - start + payload)
                };
                match RequestWithSender::with_sender(sender.to_same(), data) {
                    Some(req) => req.dispatch(&self.se),
                    None => {
                        error!("fuse ring {}: a request it cannot parse", self.qid);
                        answer_errno(sender, unique);
                    }
                }
            }
            _ => {
                error!(
                    "fuse ring {}: a request of {len} bytes with a payload of {payload}",
                    self.qid
                );
                answer_errno(sender, unique);
            }
        }
        e.dispatching.store(false, Ordering::Release);
    }

    /// Hands entry `idx` back with its reply (`copy`, or already in its
    /// buffers), and has it wait for the next request.
    /// `helper`: `ring` is the queue's helper's, and the entry's next
    /// request will complete there.
    fn commit(
        &self,
        ring: &mut Ring,
        idx: usize,
        copy: Option<Vec<u8>>,
        helper: bool,
    ) -> io::Result<()> {
        let e = self.shared.0.entries.lock()[idx].clone();
        if let Some(c) = copy {
            // SAFETY: dispatch is over; the reply is the only user now.
            unsafe { e.put_reply(&[IoSlice::new(&c)]) };
        }
        let commit_id = e.unique.get();
        // SAFETY: the reply is written; the kernel reads the header next.
        unsafe { (*e.header.get()).ent.commit_id = commit_id };
        let sqe = opcode::UringCmd80::new(types::Fd(self.dev), CMD_COMMIT_AND_FETCH)
            .cmd(cmd_req(self.qid, commit_id))
            .build()
            .user_data(idx as u64);
        push(ring, &sqe)?;
        let shared = &self.shared.0;
        helper::held(shared, &e, helper);
        shared.busy.fetch_sub(1, Ordering::Relaxed);
        if !e.pollable.load(Ordering::Relaxed) {
            shared.unpollable.fetch_sub(1, Ordering::Relaxed);
        }
        Ok(())
    }
}

/// Replies `EIO` to a request that could not be dispatched.
fn answer_errno(sender: ReplySender, unique: u64) {
    use crate::reply::{Reply, ReplyRaw};
    <ReplyRaw as Reply>::new(ll::RequestId(unique), sender)
        .send_ll(&ll::ResponseErrno(ll::Errno::EIO));
}

/// Queues `sqe`, submitting what is queued first if the ring is full.
fn push(ring: &mut Ring, sqe: &squeue::Entry128) -> io::Result<()> {
    loop {
        // SAFETY: every buffer an SQE points to (entry buffers, iovecs,
        // the eventfd word) lives as long as the queue, beyond the ring.
        if unsafe { ring.submission().push(sqe) }.is_ok() {
            return Ok(());
        }
        ring.submit()?;
    }
}

/// Sets the SQE's `len` field, which the io_uring crate's `UringCmd80`
/// leaves at 0 (FUSE's registration wants the iovec count there).
fn with_len(sqe: squeue::Entry128, len: u32) -> squeue::Entry128 {
    let mut sqe = sqe;
    // SAFETY: `Entry128` is `#[repr(C)]`, an `io_uring_sqe` followed by its
    // extra 64 bytes; `len` is the u32 at byte 24 of `io_uring_sqe`
    // (`linux/io_uring.h`: opcode, flags, ioprio, fd, off, addr, len).
    unsafe {
        let p = (&mut sqe as *mut squeue::Entry128).cast::<u8>().add(24);
        std::ptr::write_unaligned(p.cast::<u32>(), len);
    }
    sqe
}
