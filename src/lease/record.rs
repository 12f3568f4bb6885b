//! The record of one lease as the manager stores it: holder, epoch, renewal
//! time, index keys and the FIFO of waiting opens. Kept small because a
//! million of them must fit in 256 MB together with their index entries.

use std::collections::VecDeque;

use super::index::UNSET;
use super::types::{GrantCallback, HandleId, Holder, LeaseState, RenewalMode};
use crate::sync::Arc;

/// One file's lease. Kept small: a million of them must fit in 256 MB
/// together with the tables that index them.
pub(super) struct Lease {
    /// The holder; while recovering, the holder being recovered (if known).
    pub(super) holder: Option<HolderRec>,
    pub(super) epoch: u64,
    /// Own last renewal (grant, mode switch, client renewal), clock nanos.
    pub(super) renewed: u64,
    /// This lease's key in `Inner::due`, or `UNSET`.
    pub(super) due_key: u64,
    /// This lease's key in `Inner::daemon`, or `UNSET`.
    pub(super) daemon_key: u64,
    /// FIFO of waiting opens; boxed because most leases never have one.
    #[allow(clippy::box_collection)] // 8 bytes in every lease instead of 32
    pub(super) queue: Option<Box<VecDeque<Waiter>>>,
    pub(super) state: LeaseState,
    pub(super) mode: RenewalMode,
    /// The holder flushed and has not written since.
    pub(super) flushed: bool,
    /// In `Inner::contended`.
    pub(super) listed: bool,
    /// Held by maintenance (housekeeping's repairs, recovery of a file left
    /// open) rather than by a writer: see `LeaseManager::pin`.
    pub(super) pinned: bool,
}

impl Lease {
    pub(super) fn new(holder: Option<HolderRec>, epoch: u64, now: u64) -> Self {
        Lease {
            holder,
            epoch,
            renewed: now,
            due_key: UNSET,
            daemon_key: UNSET,
            queue: None,
            state: LeaseState::Held,
            mode: RenewalMode::Daemon,
            flushed: false,
            listed: false,
            pinned: false,
        }
    }

    pub(super) fn holds(&self, handle: HandleId) -> bool {
        self.state == LeaseState::Held && self.holder.as_ref().is_some_and(|h| h.handle == handle)
    }

    pub(super) fn holder_label(&self) -> String {
        match (&self.holder, self.state) {
            (Some(h), LeaseState::Held) => h.label(),
            (Some(h), _) => format!("{} (under recovery)", h.label()),
            (None, _) => "lease recovery".to_owned(),
        }
    }

    pub(super) fn waiters(&self) -> impl Iterator<Item = &Waiter> {
        self.queue.iter().flat_map(|q| q.iter())
    }

    pub(super) fn waiter_count(&self) -> usize {
        self.queue.as_ref().map_or(0, |q| q.len())
    }

    pub(super) fn push_waiter(&mut self, w: Waiter, front: bool) {
        let q = self.queue.get_or_insert_with(Default::default);
        if front {
            q.push_front(w);
        } else {
            q.push_back(w);
        }
    }

    pub(super) fn pop_waiter(&mut self) -> Option<Waiter> {
        let w = self.queue.as_mut()?.pop_front();
        self.drop_empty_queue();
        w
    }

    pub(super) fn take_waiter(&mut self, handle: HandleId) -> Option<Waiter> {
        let q = self.queue.as_mut()?;
        let pos = q.iter().position(|w| w.holder.handle == handle)?;
        let w = q.remove(pos);
        self.drop_empty_queue();
        w
    }

    pub(super) fn take_expired(&mut self, now: u64) -> VecDeque<Waiter> {
        let Some(q) = self.queue.as_mut() else {
            return VecDeque::new();
        };
        let (expired, kept): (VecDeque<_>, VecDeque<_>) = std::mem::take(&mut **q)
            .into_iter()
            .partition(|w| w.deadline <= now);
        **q = kept;
        self.drop_empty_queue();
        expired
    }

    pub(super) fn take_all(&mut self) -> VecDeque<Waiter> {
        self.queue.take().map(|q| *q).unwrap_or_default()
    }

    fn drop_empty_queue(&mut self) {
        if self.queue.as_ref().is_some_and(|q| q.is_empty()) {
            self.queue = None;
        }
    }
}

/// A holder as stored: the process name inline instead of in a `String`.
pub(super) struct HolderRec {
    pub(super) host: Arc<str>,
    pub(super) handle: HandleId,
    pub(super) opened_wall_ms: u64,
    pub(super) pid: u32,
    pub(super) comm: Comm,
}

impl HolderRec {
    pub(super) fn label(&self) -> String {
        format!("{}:{}", self.host, self.pid)
    }
}

impl From<Holder> for HolderRec {
    fn from(h: Holder) -> Self {
        HolderRec {
            host: h.host,
            handle: h.handle,
            opened_wall_ms: h.opened_wall_ms,
            pid: h.pid,
            comm: Comm::new(&h.comm),
        }
    }
}

/// A process name in 16 bytes, NUL-padded, cut at a character boundary.
#[derive(Clone, Copy)]
pub(super) struct Comm([u8; 16]);

impl Comm {
    pub(super) fn new(s: &str) -> Self {
        let mut n = s.len().min(16);
        while !s.is_char_boundary(n) {
            n -= 1;
        }
        let mut b = [0; 16];
        b[..n].copy_from_slice(&s.as_bytes()[..n]);
        Comm(b)
    }

    pub(super) fn as_str(&self) -> &str {
        let n = self.0.iter().position(|&c| c == 0).unwrap_or(16);
        std::str::from_utf8(&self.0[..n]).unwrap_or_default()
    }
}

pub(super) struct Waiter {
    pub(super) holder: Holder,
    /// Clock nanos after which `tick` times it out; `UNSET` waits for
    /// recovery, however long it takes.
    pub(super) deadline: u64,
    pub(super) cb: GrantCallback,
}
