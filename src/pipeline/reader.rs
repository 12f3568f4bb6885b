//! The read path: bytes come from the first replica whose checksums
//! verify; a corrupt, stale or missing replica is skipped, logged and
//! remembered for `fsck`.

use std::collections::{BTreeMap, BTreeSet};

use crate::storage::ReplicaReader;
use crate::sync::Arc;

use super::datanodes::Datanodes;
use crate::error::{FsError, FsResult};
use crate::meta::{BlockRow, DnId};
use crate::storage::StorageError;
use crate::sync::{Mutex, lock};

/// Replicas that failed a read, as (block id, datanode).
#[derive(Default)]
pub struct BadReplicas {
    set: Mutex<BTreeSet<(u64, DnId)>>,
}

impl BadReplicas {
    pub fn report(&self, block: u64, dn: DnId) {
        lock(&self.set).insert((block, dn));
    }
    pub fn list(&self) -> Vec<(u64, DnId)> {
        lock(&self.set).iter().copied().collect()
    }
    pub fn clear(&self, block: u64, dn: DnId) {
        lock(&self.set).remove(&(block, dn));
    }
}

/// Replica readers of finalized blocks that one open file keeps between
/// its reads. Opening a replica per request cost each 1 MiB read two
/// `open`s, two failed look-ups, `fcntl`s, `close`s and `fadvise`s, and
/// hid the sequential reader from the kernel, whose read-ahead follows one
/// open file: a fresh descriptor per request starts it anew every time.
/// A kept reader still verifies every chunk it serves; it is keyed by
/// generation stamp, which every change of a block's bytes (append,
/// truncation, recovery) bumps, so a reader of an older stamp is never
/// asked, and any failure through it drops it and goes the ordinary way
/// (open afresh, verify, report, skip to the next replica).
pub struct OpenReplicas {
    /// The opener's uid, whose share of [`KEPT`] these readers are.
    uid: u32,
    readers: Mutex<Vec<(DnId, Kept)>>,
}

/// How many replica readers a handle keeps: the blocks a sequential reader
/// is in, with room for requests the kernel sends concurrently across a
/// block boundary.
const KEPT_READERS: usize = 2;

/// Kept readers hold two descriptors each, of the daemon's, which every
/// user shares: at most this many are kept in all (the daemon's soft
/// descriptor limit is often 1,024)...
const KEPT_MAX: usize = 128;
/// ...and at most this many for one user, so that one user's many open
/// files cannot take them all. Past either bound a read opens the replica
/// for itself, as every read did before readers were kept: slower, never
/// refused.
const KEPT_PER_USER: usize = 32;

/// Kept readers of the whole daemon, by uid.
static KEPT: Mutex<BTreeMap<u32, usize>> = Mutex::new(BTreeMap::new());

/// One kept reader, counted in [`KEPT`] until dropped.
struct Kept {
    uid: u32,
    r: Arc<ReplicaReader>,
}

impl Kept {
    fn new(uid: u32, r: ReplicaReader) -> Option<Kept> {
        if !admit(&mut lock(&KEPT), uid) {
            return None;
        }
        Some(Kept {
            uid,
            r: Arc::new(r),
        })
    }
}

/// Counts one more kept reader of `uid` in `kept` if both bounds allow it.
fn admit(kept: &mut BTreeMap<u32, usize>, uid: u32) -> bool {
    let all: usize = kept.values().sum();
    let mine = kept.entry(uid).or_default();
    if all >= KEPT_MAX || *mine >= KEPT_PER_USER {
        if *mine == 0 {
            kept.remove(&uid);
        }
        return false;
    }
    *mine += 1;
    true
}

impl Drop for Kept {
    fn drop(&mut self) {
        let mut kept = lock(&KEPT);
        if let Some(n) = kept.get_mut(&self.uid) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                kept.remove(&self.uid);
            }
        }
    }
}

impl OpenReplicas {
    /// No readers kept yet, for a handle opened by `uid`.
    pub fn new(uid: u32) -> OpenReplicas {
        OpenReplicas {
            uid,
            readers: Mutex::new(Vec::new()),
        }
    }

    /// A kept reader of `b`@its stamp on one of its replicas, first in
    /// `b.replicas` order.
    fn get(&self, b: &BlockRow) -> Option<(DnId, Arc<ReplicaReader>)> {
        let readers = lock(&self.readers);
        b.replicas.iter().find_map(|dn| {
            readers
                .iter()
                .find(|(d, k)| d == dn && k.r.block() == b.block_id && k.r.gs() == b.gs)
                .map(|(d, k)| (*d, k.r.clone()))
        })
    }

    fn keep(&self, dn: DnId, r: ReplicaReader) {
        let mut readers = lock(&self.readers);
        let block = r.block();
        // Room first (this handle's older readers give theirs back), then
        // the daemon-wide bounds.
        readers.retain(|(d, k)| !(*d == dn && k.r.block() == block));
        if readers.len() >= KEPT_READERS {
            readers.remove(0);
        }
        if let Some(k) = Kept::new(self.uid, r) {
            readers.push((dn, k));
        }
    }

    /// Whether no reader is kept (a read through this handle then has
    /// nothing to serve from memory).
    pub fn is_empty(&self) -> bool {
        lock(&self.readers).is_empty()
    }

    fn forget(&self, dn: DnId, block: u64) {
        lock(&self.readers).retain(|(d, k)| !(*d == dn && k.r.block() == block));
    }
}

/// A replica a read passed over because it was missing or had another
/// generation stamp: bad only if the block list still names it afterwards.
#[derive(Debug, Clone)]
pub struct Skipped {
    pub block: u64,
    pub gs: u64,
    pub dn: DnId,
    pub why: String,
}

/// Reads up to `size` bytes at `offset` of a file of `len` visible bytes
/// made of `blocks` of `block_size`; replicas passed over as missing or
/// stale are added to `skipped`. With `open`, readers of finalized blocks
/// are kept there for the next read (see [`OpenReplicas`]).
#[allow(clippy::too_many_arguments)]
pub fn read(
    dns: &Datanodes,
    bad: &BadReplicas,
    open: Option<&OpenReplicas>,
    blocks: &[BlockRow],
    block_size: u64,
    len: u64,
    offset: u64,
    size: usize,
    skipped: &mut Vec<Skipped>,
) -> FsResult<Vec<u8>> {
    if offset >= len {
        return Ok(Vec::new());
    }
    let end = len.min(offset + size as u64);
    // Every byte of it is written below (a hole as zeros) before it is
    // returned, so a recycled buffer's old contents never reach a reader.
    let mut out = spare_buffer((end - offset) as usize);
    by_block(blocks, block_size, offset, &mut out, |b, off, dst| {
        read_block(dns, bad, open, b, off, dst, skipped)
    })?;
    Ok(out)
}

/// Splits `out`, the file's bytes from `offset` on, at block boundaries
/// and has `f` fill each piece from its block (with the offset in the
/// block); a hole (grown by truncate before any block existed) reads as
/// zeros.
fn by_block<E>(
    blocks: &[BlockRow],
    block_size: u64,
    offset: u64,
    out: &mut [u8],
    mut f: impl FnMut(&BlockRow, u64, &mut [u8]) -> Result<(), E>,
) -> Result<(), E> {
    let end = offset + out.len() as u64;
    let mut pos = offset;
    while pos < end {
        let idx = pos / block_size;
        let bstart = idx * block_size;
        let n = ((bstart + block_size).min(end) - pos) as usize;
        let dst = &mut out[(pos - offset) as usize..][..n];
        match blocks.iter().find(|b| b.idx == idx) {
            None => dst.fill(0),
            Some(b) => f(b, pos - bstart, dst)?,
        }
        pos += n as u64;
    }
    Ok(())
}

/// [`read`] of a range whose bytes and checksums are all in memory, into
/// `out` (as many bytes as asked), through readers `open` keeps, for a
/// request thread: how many bytes it holds then, or `None` as soon as
/// anything would wait for a disk or is not as the fast case wants it (a
/// block not finalized or without a kept reader, any error). [`read`] then
/// serves the request on the blocking pool, and finds and reports whatever
/// went wrong. Every chunk served is verified, as by [`read`].
pub fn read_cached(
    open: &OpenReplicas,
    blocks: &[BlockRow],
    block_size: u64,
    len: u64,
    offset: u64,
    out: &mut [u8],
) -> Option<usize> {
    if offset >= len {
        return Some(0);
    }
    let n = (len.min(offset + out.len() as u64) - offset) as usize;
    by_block(blocks, block_size, offset, &mut out[..n], |b, off, dst| {
        let got = if b.finalized {
            open.get(b)
                .and_then(|(_, r)| r.read_cached(off, dst).ok().flatten())
        } else {
            None
        };
        if got == Some(dst.len()) {
            return Ok(());
        }
        tracing::trace!(
            offset,
            block = b.block_id,
            off,
            ?got,
            "not served from memory"
        );
        Err(())
    })
    .ok()?;
    Some(n)
}

/// Read buffers kept for the next read on the same thread (the blocking
/// pool's), so that a 1 MiB read neither allocates nor zeroes 1 MiB: the
/// daemon spent 6% of a served read in `memset` (benches/PROFILE.md,
/// "Reads, issue 28").
mod spare {
    use std::cell::RefCell;

    /// Buffers larger than this are not kept.
    pub const MAX: usize = 4 << 20;

    thread_local! {
        pub static BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    }
}

/// A buffer of `len` bytes of unspecified contents: this thread's spare if
/// it has one.
pub fn spare_buffer(len: usize) -> Vec<u8> {
    let mut v = spare::BUF.with(|b| std::mem::take(&mut *b.borrow_mut()));
    v.resize(len, 0);
    v
}

/// Hands a read's buffer back once its bytes were sent, for the next
/// read on this thread.
pub fn recycle(v: Vec<u8>) {
    if v.capacity() <= spare::MAX {
        spare::BUF.with(|b| {
            let mut b = b.borrow_mut();
            if b.capacity() < v.capacity() {
                *b = v;
            }
        });
    }
}

fn read_block(
    dns: &Datanodes,
    bad: &BadReplicas,
    open: Option<&OpenReplicas>,
    b: &BlockRow,
    off: u64,
    dst: &mut [u8],
    skipped: &mut Vec<Skipped>,
) -> FsResult<()> {
    let keep = open.filter(|_| b.finalized);
    if let Some((dn, r)) = keep.and_then(|o| o.get(b)) {
        match r.read_kept(off, dst) {
            Ok(got) if got >= dst.len() => return Ok(()),
            // Whatever went wrong is found again, and reported, below.
            _ => keep.into_iter().for_each(|o| o.forget(dn, b.block_id)),
        }
    }
    let mut last_err = None;
    let mut moved = false;
    // This host's copy first: a local read (see `copies`).
    for &dn in dns.read_order(&b.replicas).iter() {
        let Some(node) = dns.get(dn) else { continue };
        // An rbw replica may be appended to while we read it: its last
        // chunk's data and checksum are written one after the other, so a
        // mismatch there is retried before the replica is called corrupt.
        let tries = if b.finalized { 1 } else { 3 };
        for attempt in 0..tries {
            let got = match keep {
                Some(o) => node.open_reader(b.block_id, b.gs).and_then(|r| {
                    let got = r.read(off, dst)?;
                    if got >= dst.len() {
                        o.keep(dn, r);
                    }
                    Ok(got)
                }),
                None => node.read(b.block_id, b.gs, off, dst),
            };
            match got {
                Ok(got) if got >= dst.len() => return Ok(()),
                Ok(got) => {
                    last_err = Some(format!("short read ({got} of {} bytes)", dst.len()));
                    if attempt + 1 == tries {
                        report(bad, b, dn, last_err.as_deref().unwrap_or(""));
                    }
                }
                Err(e @ StorageError::Corrupt { .. }) if attempt + 1 < tries => {
                    last_err = Some(e.to_string());
                    std::thread::yield_now();
                }
                // The block moved on (a writer reopened it for append, or
                // pipeline recovery bumped its generation stamp) since the
                // caller read the block list: not a bad replica; the caller
                // retries with a fresh list.
                Err(e @ (StorageError::StaleGenStamp { .. } | StorageError::Missing { .. })) => {
                    last_err = Some(e.to_string());
                    skipped.push(Skipped {
                        block: b.block_id,
                        gs: b.gs,
                        dn,
                        why: e.to_string(),
                    });
                    moved = true;
                    break;
                }
                Err(e) => {
                    last_err = Some(e.to_string());
                    report(bad, b, dn, &e.to_string());
                    break;
                }
            }
        }
    }
    let why = format!(
        "no good replica of block {}: {}",
        b.block_id,
        last_err.unwrap_or_else(|| "no replicas".into())
    );
    if moved {
        return Err(FsError::Moved(why));
    }
    Err(FsError::Io(why))
}

fn report(bad: &BadReplicas, b: &BlockRow, dn: DnId, why: &str) {
    report_replica(bad, b.block_id, dn, why)
}

pub fn report_replica(bad: &BadReplicas, block: u64, dn: DnId, why: &str) {
    tracing::warn!(block, datanode = %dn, "bad replica skipped: {why}");
    bad.report(block, dn);
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::{KEPT_MAX, KEPT_PER_USER, admit};

    #[test]
    fn kept_readers_are_bounded_per_user_and_in_all() {
        let mut kept = BTreeMap::new();
        let mine = (0..KEPT_PER_USER + 5)
            .filter(|_| admit(&mut kept, 1000))
            .count();
        assert_eq!(mine, KEPT_PER_USER, "one user's share");
        let mut uid = 2000;
        while admit(&mut kept, uid) {
            if kept[&uid] == KEPT_PER_USER {
                uid += 1;
            }
        }
        assert_eq!(kept.values().sum::<usize>(), KEPT_MAX, "the daemon's bound");
        assert!(!admit(&mut kept, 9999), "a new user past the bound");
        assert!(!kept.contains_key(&9999), "a refused user leaves no entry");
    }
}
