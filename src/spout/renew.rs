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

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

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
#[derive(Debug)]
struct Entry {
    file: Arc<File>,
    lost: Arc<AtomicBool>,
    /// Milliseconds since the renewer's origin of the last good renewal.
    renewed_at: Arc<AtomicU64>,
}

#[derive(Debug)]
struct Inner {
    origin: Instant,
    interval: Duration,
    entries: Mutex<HashMap<u64, Entry>>,
    next_key: AtomicU64,
    stop: Mutex<bool>,
    wake: Condvar,
}

impl Inner {
    fn now_ms(&self) -> u64 {
        self.origin.elapsed().as_millis() as u64
    }

    /// Renews every registered lease once. The map stays locked while the
    /// ioctls run, so a lease being released (removed under the same lock)
    /// is never renewed through a descriptor that is being closed.
    fn renew_all(&self) {
        let entries = lock(&self.entries);
        for e in entries.values() {
            if e.lost.load(Ordering::SeqCst) {
                continue;
            }
            match lease_ioctl(&e.file, IOC_RENEW) {
                Ok(()) => e.renewed_at.store(self.now_ms(), Ordering::SeqCst),
                Err(err) => {
                    if !e.lost.swap(true, Ordering::SeqCst) {
                        tracing::warn!("lease renewal failed ({err}): the lock is lost");
                    }
                }
            }
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
    pub fn start(interval: Duration) -> std::io::Result<Renewer> {
        let inner = Arc::new(Inner {
            origin: Instant::now(),
            interval,
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
        lease_ioctl(&file, IOC_CLIENT_RENEWAL)?;
        let file = Arc::new(file);
        let lost = Arc::new(AtomicBool::new(false));
        let renewed_at = Arc::new(AtomicU64::new(self.inner.now_ms()));
        let key = self.inner.next_key.fetch_add(1, Ordering::SeqCst);
        lock(&self.inner.entries).insert(
            key,
            Entry {
                file: file.clone(),
                lost: lost.clone(),
                renewed_at: renewed_at.clone(),
            },
        );
        Ok(RenewedLease {
            inner: self.inner.clone(),
            key,
            file,
            lost,
            renewed_at,
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
    lost: Arc<AtomicBool>,
    renewed_at: Arc<AtomicU64>,
}

impl RenewedLease {
    pub fn file(&self) -> &File {
        &self.file
    }

    /// True once a renewal or a write showed that the lease was preempted.
    pub fn is_lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    /// Marks the lease lost (a write through it failed with `EIO`).
    pub fn mark_lost(&self) {
        self.lost.store(true, Ordering::SeqCst);
    }

    /// Renews now; `false` (and the lease marked lost) if it was preempted.
    pub fn renew_now(&self) -> bool {
        if self.is_lost() {
            return false;
        }
        match lease_ioctl(&self.file, IOC_RENEW) {
            Ok(()) => {
                self.renewed_at.store(self.inner.now_ms(), Ordering::SeqCst);
                true
            }
            Err(e) => {
                if !self.lost.swap(true, Ordering::SeqCst) {
                    tracing::warn!("lease renewal failed ({e}): the lock is lost");
                }
                false
            }
        }
    }

    /// Whether the lease is still ours, cheaply: a lease renewed recently
    /// by the thread is taken as held; one not renewed for longer than
    /// 1.5 renewal intervals (the process was stopped, or the thread
    /// starved) is checked with a renewal now. So an instance resumed after
    /// SIGSTOP notices a takeover before it emits another record.
    pub fn still_held(&self) -> bool {
        if self.is_lost() {
            return false;
        }
        let age = self
            .inner
            .now_ms()
            .saturating_sub(self.renewed_at.load(Ordering::SeqCst));
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
        let r = Renewer::start(Duration::from_millis(10)).unwrap();
        let e = r.adopt(f).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOTTY), "{e}");
        assert!(lock(&r.inner.entries).is_empty());
    }
}
