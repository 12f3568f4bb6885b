//! The kernel's page cache of file data: which opens may use it, and the
//! invalidations that keep it from ever showing a reader stale bytes.
//!
//! The rule (docs/SEMANTICS.md, "Page cache"):
//! - A read-only open of a regular file that nobody is changing (no write
//!   handle, no truncation, no recovery, lease free) is served through the
//!   page cache. It keeps the pages of earlier opens (`FOPEN_KEEP_CACHE`)
//!   only while they are known to match the file; otherwise the kernel drops
//!   them at that open. Every other open is `direct_io`.
//! - Once anything may change the file, cached opens are no longer kept.
//! - While cached handles opened before a writer are still open, each of
//!   the writer's writes is answered only once its bytes are acknowledged
//!   and the pages from the previous visible end to the new one have been
//!   invalidated. So the kernel's file size never runs ahead of the visible
//!   length, and no page read while the end was elsewhere (zero-filled past
//!   it) survives the growth.
//! - Truncation and recovery invalidate the whole file before they report.
//!
//! Notifications are sent from the blocking pool, never from a request
//! thread: the kernel may hold a page lock while waiting for a READ reply,
//! and the invalidation waits for that lock.

use std::sync::OnceLock;

use dashmap::DashMap;

use super::request::Reply;
use crate::sync::Arc;

/// Tells the kernel to forget an inode's cached attributes and the cached
/// data of bytes `offset..offset+len` (`len` 0: to the end of the file).
/// Blocks while the kernel waits for a READ of those pages: never call it
/// from a request thread.
pub type Invalidator = Arc<dyn Fn(u64, i64, i64) + Send + Sync>;

/// Stores `data` at `offset` of an inode in the kernel's cache
/// (`FUSE_NOTIFY_STORE`), growing the kernel's size of the file to
/// `offset + data.len()` if it was smaller. Blocks on the inode's pages:
/// never call it from a request thread.
pub type Storer = Arc<dyn Fn(u64, u64, &[u8]) + Send + Sync>;

/// What the kernel may cache of one inode's data.
#[derive(Debug, Default, Clone, Copy)]
pub struct PageCache {
    /// Open handles reading through the page cache.
    pub cached: u32,
    /// Write handles, truncations and recoveries under way.
    pub busy: u32,
    /// The kernel's pages of this inode (if any) match the file: the next
    /// cached open may keep them.
    pub keep: bool,
    /// A cached open happened since the last invalidation of the whole
    /// file, so the kernel may hold pages.
    pub maybe_pages: bool,
}

impl PageCache {
    fn unused(&self) -> bool {
        self.cached == 0 && self.busy == 0 && !self.keep && !self.maybe_pages
    }
}

/// How a read-only open is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadMode {
    Direct,
    /// Through the page cache; `keep`: the kernel keeps earlier pages.
    Cached {
        keep: bool,
    },
}

/// Whole pages: the range [from, to] rounded out to the page size.
fn page_range(from: u64, to: u64) -> (i64, i64) {
    // SAFETY: sysconf has no preconditions.
    let page = match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        p if p > 0 => p as u64,
        _ => 4096,
    };
    let start = from - from % page;
    let len = to.saturating_sub(start) + 1;
    (start as i64, len.min(i64::MAX as u64) as i64)
}

/// The page-cache state of every inode the kernel may cache, and the
/// kernel's invalidation channel (set once the FUSE session exists).
pub struct PageCaches {
    map: DashMap<u64, PageCache>,
    invalidator: OnceLock<Invalidator>,
    storer: OnceLock<Storer>,
    /// Where notifications are sent from: never a request thread.
    rt: tokio::runtime::Handle,
}

impl PageCaches {
    pub fn new(rt: tokio::runtime::Handle) -> PageCaches {
        PageCaches {
            map: DashMap::new(),
            invalidator: OnceLock::new(),
            storer: OnceLock::new(),
            rt,
        }
    }

    pub fn set_invalidator(&self, f: Invalidator) {
        let _ = self.invalidator.set(f);
    }

    pub fn set_storer(&self, f: Storer) {
        let _ = self.storer.set(f);
    }

    /// Tells the kernel that `ino` is `size` bytes long, its last byte
    /// `last`, before a writer's grant is answered: with its descriptors
    /// in direct I/O the kernel places an `O_APPEND` write, and the file
    /// position after it, at its own size of the file, which it refreshes
    /// only when it asks for the attributes; another daemon's appends
    /// leave it short. Storing the last byte is the one notification that
    /// sets the size (it only grows it); the page it touched is dropped
    /// again and the attributes forgotten, so that a stat asks. From the
    /// blocking pool only.
    pub fn tell_size(&self, ino: u64, size: u64, last: u8) {
        if size == 0 {
            return self.forget_attrs(ino);
        }
        if let Some(f) = self.storer.get() {
            f(ino, size - 1, &[last]);
        }
        if let Some(f) = self.invalidator.get() {
            let (from, len) = page_range(size - 1, size - 1);
            f(ino, from, len);
        }
    }

    /// Has the kernel forget `ino`'s cached attributes (not its pages),
    /// now, on this thread: without pages to drop the notification waits
    /// for no lock a request may hold, so a request thread may send it.
    pub fn forget_attrs(&self, ino: u64) {
        if let Some(f) = self.invalidator.get() {
            f(ino, -1, 0);
        }
    }

    /// The page-cache state of `ino` (a copy).
    pub fn state(&self, ino: u64) -> PageCache {
        self.map.get(&ino).map(|p| *p).unwrap_or_default()
    }

    /// The mode of a read-only open of a regular file that nobody writes
    /// or holds the lease of (the caller has checked), recording a cached
    /// one. Decided under the inode's entry lock, which writers take to
    /// become busy: either the writer sees this reader, or this open sees
    /// the writer.
    pub fn open_reader(&self, ino: u64) -> ReadMode {
        let mut p = self.map.entry(ino).or_default();
        if p.busy > 0 {
            return ReadMode::Direct;
        }
        let keep = p.keep;
        p.keep = true;
        p.maybe_pages = true;
        p.cached += 1;
        ReadMode::Cached { keep }
    }

    /// A cached handle was released.
    pub fn cached_closed(&self, ino: u64) {
        self.update(ino, |p| p.cached = p.cached.saturating_sub(1));
    }

    /// Something may change `ino` from now on (a write handle, truncation,
    /// recovery): opens are direct, earlier pages are no longer kept.
    /// Returns the state as it was.
    pub fn busy(&self, ino: u64) -> PageCache {
        let mut p = self.map.entry(ino).or_default();
        let before = *p;
        p.busy += 1;
        p.keep = false;
        before
    }

    /// The change that `busy` announced is over.
    pub fn idle(&self, ino: u64) {
        self.update(ino, |p| p.busy = p.busy.saturating_sub(1));
    }

    /// Handles reading through the page cache are open on `ino`.
    pub fn has_cached_readers(&self, ino: u64) -> bool {
        self.map.get(&ino).is_some_and(|p| p.cached > 0)
    }

    /// The kernel forgot the inode, and its pages with it.
    pub fn forget(&self, ino: u64) {
        self.map
            .remove_if(&ino, |_, p| p.cached == 0 && p.busy == 0);
    }

    /// The inode is deleted.
    pub fn drop_state(&self, ino: u64) {
        self.map.remove(&ino);
    }

    fn update(&self, ino: u64, f: impl FnOnce(&mut PageCache)) {
        if let Some(mut p) = self.map.get_mut(&ino) {
            f(&mut p);
        }
        self.map.remove_if(&ino, |_, p| p.unused());
    }

    /// Drops the kernel's pages of bytes `from..=to` of `ino` (whole
    /// pages), then calls `then`; on the blocking pool.
    pub fn invalidate_range_then(
        &self,
        ino: u64,
        from: u64,
        to: u64,
        then: impl FnOnce() + Send + 'static,
    ) {
        let (off, len) = page_range(from, to);
        self.notify_then(ino, off, len, then)
    }

    fn notify_then(&self, ino: u64, off: i64, len: i64, then: impl FnOnce() + Send + 'static) {
        let Some(f) = self.invalidator.get().cloned() else {
            return then();
        };
        self.rt.spawn_blocking(move || {
            f(ino, off, len);
            then()
        });
    }

    /// After a change of the whole file (truncation, O_TRUNC): drops all
    /// its pages if the kernel may hold any, then replies `r`.
    pub fn invalidate_all_then<T: Send + 'static>(
        self: &Arc<Self>,
        ino: u64,
        r: T,
        reply: Reply<T>,
    ) {
        let p = self.state(ino);
        if !(p.maybe_pages || p.cached > 0) {
            return reply(Ok(r));
        }
        let me = self.clone();
        self.notify_then(ino, 0, 0, move || {
            me.pages_dropped(ino);
            reply(Ok(r))
        });
    }

    /// Drops every page of `ino` now, on the calling thread, which must be
    /// off the request threads (recovery runs on the blocking pool).
    pub fn invalidate_all_now(&self, ino: u64) {
        if let Some(f) = self.invalidator.get() {
            f(ino, 0, 0);
            self.pages_dropped(ino);
        }
    }

    /// The whole file was invalidated: without cached handles no pages are
    /// left (new cached opens cannot come while the file is busy).
    fn pages_dropped(&self, ino: u64) {
        self.update(ino, |p| {
            if p.cached == 0 {
                p.maybe_pages = false;
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::page_range;

    #[test]
    fn page_range_covers_whole_pages_from_the_old_end_to_the_new_one() {
        // 4 KiB pages on every machine these tests run on.
        assert_eq!(page_range(10_000, 10_000), (8192, 1809));
        assert_eq!(page_range(8192, 12_288), (8192, 4097));
        assert_eq!(page_range(0, 0), (0, 1));
    }
}
