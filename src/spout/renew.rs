//! Client renewal of the spout's write leases.
//!
//! Every lock the spout holds (a file's lock file, `DIRLOCK`) is an open
//! write descriptor switched to client renewal
//! (`LEASEFS_IOC_CLIENT_RENEWAL`), so the daemon no longer renews it on the
//! spout's behalf. One [`Renewer`] thread per spout renews them all
//! (`LEASEFS_IOC_RENEW`) every `renew_interval`, which must be well below
//! the mount's soft limit. If the process is stopped (SIGSTOP, a hang), the
//! renewals stop, the leases expire after the soft limit, and another
//! instance may take the locks over: that is the whole point of client
//! renewal. A renewal that fails with `EIO` means the lease was preempted:
//! the lock is marked lost and the owner abandons it.
//!
//! Renewals are `LEASEFS_IOC_RENEW_VALID`, whose answer says for how long
//! from the call nobody else can be granted the lease: the holder counts
//! that from when it *sent* the call and stops acting on a lock at that
//! deadline, by its own clock, whatever its daemon does (a stalled daemon
//! blocks the renewal thread, never the check). The run loop's checks
//! ([`RenewedLease::still_held`]) make no call to the daemon; the only
//! renewals outside the thread ([`RenewedLease::renew_now`], before an
//! irreversible step) run on a thread of their own and are waited for no
//! longer than what is left of the lease. The leases of a file stop being
//! renewed once its consumer stalls ([`super::watch::Watch`]): renewal
//! depends on progress.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::thread::JoinHandle;
use std::time::Duration;

use super::watch::Watch;
use crate::clock::{BootClock, Clock};
use crate::elect::leader_file::renew_valid;
use crate::sync::{Arc, AtomicBool, AtomicU64, Condvar, Mutex, Ordering, lock};

/// `_IO('L', 1)`: this descriptor's lease is renewed by the caller from now on.
pub const IOC_CLIENT_RENEWAL: u32 = 0x4C01;
/// `_IO('L', 2)`: renew this descriptor's lease now.
pub const IOC_RENEW: u32 = 0x4C02;

/// Issues one of the argument-less leasefs ioctls on `file`.
pub fn lease_ioctl(file: &File, cmd: u32) -> std::io::Result<()> {
    // SAFETY: an ioctl without argument on a descriptor `file` keeps open.
    let r = unsafe { libc::ioctl(file.as_raw_fd(), cmd as _) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Shared state of one renewed lease.
#[derive(Debug, Clone)]
struct Entry {
    file: Arc<File>,
    state: Arc<State>,
    /// Renewed only while its consumer makes progress (a file's locks).
    watched: bool,
}

/// What is known of one lease, on the boot clock.
#[derive(Debug, Default)]
struct State {
    lost: AtomicBool,
    /// Milliseconds of the last good renewal's answer.
    renewed_at: AtomicU64,
    /// Until when the daemon vouches for the lease, counted from when the
    /// renewal was sent; 0 when the daemon does not say (an older one).
    valid_until: AtomicU64,
    /// The stalled consumer was reported once.
    said_stalled: AtomicBool,
}

/// Whether a renewal error says the lease is gone (preempted: `EIO`; or
/// the descriptor is no writer's any more) rather than that it could not
/// be renewed this time (`ETIMEDOUT` over etcd: try again).
fn is_gone(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EIO) | Some(libc::EBADF))
}

impl State {
    /// Renews through `file` now (one call, blocking); true when renewed.
    fn renew(&self, file: &File) -> bool {
        let sent = now_ms();
        match renew_valid(file) {
            Ok(v) => {
                let now = now_ms();
                self.renewed_at.store(now, Ordering::SeqCst);
                let until = v.map_or(0, |v| sent + v.as_millis() as u64);
                self.valid_until.store(until, Ordering::SeqCst);
                true
            }
            Err(err) if is_gone(&err) => {
                if !self.lost.swap(true, Ordering::SeqCst) {
                    tracing::warn!("lease renewal failed ({err}): the lock is lost");
                }
                false
            }
            Err(err) => {
                tracing::warn!("lease renewal failed ({err}); the lock is kept until its deadline");
                false
            }
        }
    }
}

/// Boot-clock milliseconds: a suspended machine's deadlines pass while it
/// sleeps.
fn now_ms() -> u64 {
    BootClock.now().as_millis() as u64
}

#[derive(Debug)]
struct Inner {
    interval: Duration,
    /// The consumer's progress, for the watched leases.
    watch: Option<Watch>,
    entries: Mutex<HashMap<u64, Entry>>,
    next_key: AtomicU64,
    stop: Mutex<bool>,
    wake: Condvar,
}

impl Inner {
    /// Renews every registered lease once, but those of a stalled consumer.
    /// The map is not locked during the calls (a stalled daemon must not
    /// block the run loop's adopt or release behind this thread); a lease
    /// dropped meanwhile is closed once its call returns.
    fn renew_all(&self) {
        let entries: Vec<Entry> = lock(&self.entries).values().cloned().collect();
        let stalled = self.watch.as_ref().filter(|w| w.stalled());
        for e in entries {
            if e.state.lost.load(Ordering::SeqCst) {
                continue;
            }
            if e.watched
                && let Some(w) = stalled
            {
                if !e.state.said_stalled.swap(true, Ordering::SeqCst) {
                    tracing::warn!(
                        "the consumer made no progress for {} ms: its file's leases are no longer renewed",
                        w.quiet_for().as_millis()
                    );
                }
                continue;
            }
            e.state.renew(&e.file);
        }
    }
}

/// The renewal thread of one spout. Dropping it stops the thread.
#[derive(Debug)]
pub struct Renewer {
    inner: Arc<Inner>,
    thread: Option<JoinHandle<()>>,
}

impl Renewer {
    /// A renewal thread; `watch`: the consumer's progress, on which the
    /// renewal of the leases taken by [`Renewer::adopt_watched`] depends.
    pub fn start(interval: Duration, watch: Option<Watch>) -> std::io::Result<Renewer> {
        let inner = Arc::new(Inner {
            interval,
            watch,
            entries: Mutex::new(HashMap::new()),
            next_key: AtomicU64::new(1),
            stop: Mutex::new(false),
            wake: Condvar::new(),
        });
        let worker = inner.clone();
        let thread = std::thread::Builder::new()
            .name("spout-renewer".into())
            .spawn(move || {
                let mut stop = lock(&worker.stop);
                loop {
                    let (s, _) = worker
                        .wake
                        .wait_timeout(stop, worker.interval)
                        .unwrap_or_else(|e| e.into_inner());
                    stop = s;
                    if *stop {
                        return;
                    }
                    drop(stop);
                    worker.renew_all();
                    stop = lock(&worker.stop);
                }
            })?;
        Ok(Renewer {
            inner,
            thread: Some(thread),
        })
    }

    /// Switches `file` (a fresh write descriptor) to client renewal and
    /// renews it from now on until the returned lease is dropped.
    pub fn adopt(&self, file: File) -> std::io::Result<RenewedLease> {
        self.adopt_with(file, false)
    }

    /// As [`Renewer::adopt`], for a lease of the file being consumed:
    /// renewed only while the consumer makes progress (counted from now).
    pub fn adopt_watched(&self, file: File) -> std::io::Result<RenewedLease> {
        if let Some(w) = &self.inner.watch {
            w.beat();
        }
        self.adopt_with(file, true)
    }

    fn adopt_with(&self, file: File, watched: bool) -> std::io::Result<RenewedLease> {
        lease_ioctl(&file, IOC_CLIENT_RENEWAL)?;
        let file = Arc::new(file);
        let state = Arc::new(State::default());
        // The first renewal says how long the lease is vouched for.
        if !state.renew(&file) && state.lost.load(Ordering::SeqCst) {
            return Err(std::io::Error::from_raw_os_error(libc::EIO));
        }
        let key = self.inner.next_key.fetch_add(1, Ordering::SeqCst);
        lock(&self.inner.entries).insert(
            key,
            Entry {
                file: file.clone(),
                state: state.clone(),
                watched,
            },
        );
        Ok(RenewedLease {
            inner: self.inner.clone(),
            key,
            file,
            state,
        })
    }
}

impl Drop for Renewer {
    fn drop(&mut self) {
        *lock(&self.inner.stop) = true;
        self.inner.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A write descriptor whose lease the [`Renewer`] keeps alive. Dropping it
/// stops the renewals and closes the descriptor, which releases the lease.
#[derive(Debug)]
pub struct RenewedLease {
    inner: Arc<Inner>,
    key: u64,
    file: Arc<File>,
    state: Arc<State>,
}

impl RenewedLease {
    pub fn file(&self) -> &File {
        &self.file
    }

    /// True once a renewal or a write showed that the lease was preempted.
    pub fn is_lost(&self) -> bool {
        self.state.lost.load(Ordering::SeqCst)
    }

    /// Marks the lease lost (a write through it failed with `EIO`).
    pub fn mark_lost(&self) {
        self.state.lost.store(true, Ordering::SeqCst);
    }

    /// How long the lease is still vouched for, by the last renewal's
    /// answer counted from when it was sent, less a tenth of that answer
    /// for safety; `None` from a daemon that does not say.
    fn vouched_for(&self) -> Option<Duration> {
        let until = self.state.valid_until.load(Ordering::SeqCst);
        if until == 0 {
            return None;
        }
        let renewed = self.state.renewed_at.load(Ordering::SeqCst);
        let margin = until.saturating_sub(renewed) / 10;
        Some(Duration::from_millis(
            until.saturating_sub(margin).saturating_sub(now_ms()),
        ))
    }

    /// Renews now, on a thread of its own waited for no longer than what
    /// is left of the lease (the renewal interval from a daemon that does
    /// not say): a stalled daemon cannot hold the caller past its lease.
    /// `false` if the lease was preempted or is no longer vouched for.
    pub fn renew_now(&self) -> bool {
        if self.is_lost() {
            return false;
        }
        let bound = self.vouched_for().unwrap_or(self.inner.interval);
        if bound.is_zero() {
            return false;
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let (file, state) = (self.file.clone(), self.state.clone());
        let spawned = std::thread::Builder::new()
            .name("spout-renew-now".into())
            .spawn(move || {
                let _ = tx.send(state.renew(&file));
            });
        if spawned.is_err() {
            return false;
        }
        rx.recv_timeout(bound).unwrap_or(false)
    }

    /// Whether the lease is still ours, without a call to the daemon: not
    /// known lost, and still within what the last renewal's answer vouched
    /// for (counted from when it was sent). So an instance resumed after
    /// SIGSTOP, or whose daemon stalled, stops before its lease may have
    /// gone to someone else. From a daemon that does not say how long, a
    /// lease not renewed for 1.5 intervals is checked with a renewal now.
    pub fn still_held(&self) -> bool {
        if self.is_lost() {
            return false;
        }
        if let Some(left) = self.vouched_for() {
            return !left.is_zero();
        }
        let age = now_ms().saturating_sub(self.state.renewed_at.load(Ordering::SeqCst));
        if age <= self.inner.interval.as_millis() as u64 * 3 / 2 {
            return true;
        }
        self.renew_now()
    }
}

impl Drop for RenewedLease {
    fn drop(&mut self) {
        // Removed under the map's lock: the renewal thread never touches
        // the descriptor again, and our Arc is the last one, so dropping
        // it closes the descriptor right here.
        lock(&self.inner.entries).remove(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_leasefs_client_renewal_is_refused() {
        let f = tempfile::tempfile().unwrap();
        let r = Renewer::start(Duration::from_millis(10), None).unwrap();
        let e = r.adopt(f).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOTTY), "{e}");
        assert!(lock(&r.inner.entries).is_empty());
    }
}
