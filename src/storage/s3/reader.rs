//! [`ObjectReader`]: verified reads of a replica made of slices. Every
//! chunk served is checked against the CRC its slice carries, as a
//! directory replica's chunks are against its checksum file; a corrupt,
//! truncated or replaced slice object gives [`StorageError::Corrupt`].

use std::path::PathBuf;

use super::super::checksum::{CHUNK_SIZE, crc};
use super::super::error::StorageError;
use super::super::layout::ReplicaState;
use super::bucket::Bucket;
use super::keys::{Extent, SLICE_MAGIC, len_of, slice_key};
use crate::metrics::IoCounters;
use crate::sync::{Arc, AtomicU64, Mutex, Ordering, lock};

const CS: u64 = CHUNK_SIZE as u64;

/// How far a sequential reader's request is extended inside its slice:
/// each request to the store costs its latency (40–60 ms on the test
/// store, tens of ms on a cloud one) whatever its size, so reads fetched
/// as the kernel asks (up to 1 MiB) ran at 25 MB/s where one GET of the
/// object runs at 500+.
const AHEAD: u64 = 8 << 20;

/// Read-ahead windows of every object reader of the daemon, at most:
/// past it a read fetches only what it asks for. Kept readers are bounded
/// (`pipeline::reader`), their windows by this.
const AHEAD_BUDGET: u64 = 64 << 20;

static AHEAD_HELD: AtomicU64 = AtomicU64::new(0);

/// Verified bytes fetched past what a sequential reader asked for.
#[derive(Debug, Default)]
pub(super) struct Ahead {
    /// Replica offset of `bytes[0]`.
    start: u64,
    bytes: Vec<u8>,
    /// Where the last read ended: a read starting there is sequential.
    next: u64,
}

impl Ahead {
    /// Replaces the window, within the daemon's budget; false (and the
    /// window emptied) when `bytes` does not fit.
    fn set(&mut self, start: u64, bytes: Vec<u8>) -> bool {
        self.clear();
        let n = bytes.len() as u64;
        let fits = AHEAD_HELD
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |h| {
                (h + n <= AHEAD_BUDGET).then_some(h + n)
            })
            .is_ok();
        if fits {
            self.start = start;
            self.bytes = bytes;
        }
        fits
    }

    fn clear(&mut self) {
        AHEAD_HELD.fetch_sub(self.bytes.len() as u64, Ordering::AcqRel);
        self.bytes = Vec::new();
    }
}

impl Drop for Ahead {
    fn drop(&mut self) {
        self.clear();
    }
}

/// One replica's slices, as listed when it was opened (slices are
/// immutable: a later cut or append adds slices, never changes these).
#[derive(Debug)]
pub struct ObjectReader {
    pub(super) bucket: Arc<Bucket>,
    pub(super) block: u64,
    pub(super) gs: u64,
    pub(super) state: ReplicaState,
    pub(super) ext: Vec<Extent>,
    pub(super) io: Arc<IoCounters>,
    /// `s3://bucket/prefix/blk/<id>/<gs>`, for errors.
    pub(super) path: PathBuf,
    /// The read-ahead window (slices are immutable: it never goes stale).
    pub(super) ahead: Mutex<Ahead>,
}

impl ObjectReader {
    pub fn block(&self) -> u64 {
        self.block
    }
    pub fn gs(&self) -> u64 {
        self.gs
    }
    pub fn state(&self) -> ReplicaState {
        self.state
    }
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }
    pub fn len(&self) -> u64 {
        len_of(&self.ext)
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Reads up to `buf.len()` bytes at `offset`, every chunk touched
    /// verified; fewer at the end of the replica.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<usize, StorageError> {
        let r = self.read_verified(offset, buf);
        match &r {
            Ok(n) => self.io.read(*n as u64),
            Err(_) => self.io.error(),
        }
        r
    }

    fn read_verified(&self, offset: u64, buf: &mut [u8]) -> Result<usize, StorageError> {
        let end = (offset + buf.len() as u64).min(self.len());
        if offset >= end {
            return Ok(0);
        }
        // Held while fetching ahead, so that the kernel's concurrent reads
        // of the next stretch wait for the window rather than fetch it
        // again.
        let mut w = lock(&self.ahead);
        let have = w.start..w.start + w.bytes.len() as u64;
        if have.start <= offset && end <= have.end {
            let from = (offset - w.start) as usize;
            buf[..(end - offset) as usize]
                .copy_from_slice(&w.bytes[from..from + (end - offset) as usize]);
            w.next = w.next.max(end);
            return Ok((end - offset) as usize);
        }
        // Sequential: starting where the last read ended, or inside the
        // stretch the kernel's read-ahead has in flight beyond it.
        let sequential = offset > 0 && offset >= w.next && offset <= w.next + (1 << 20);
        if !sequential {
            drop(w);
            self.fetch_exact(offset, end, buf)?;
            lock(&self.ahead).next = end;
            return Ok((end - offset) as usize);
        }
        let mut done = offset;
        for e in &self.ext {
            let a = offset.max(e.slice.start);
            let b = end.min(e.end);
            if a >= b {
                continue;
            }
            // The last extent is fetched further, in the same requests;
            // a fault in what nobody asked for yet must not fail this
            // read: then the exact range again.
            let further = (a + AHEAD).min(e.end);
            let bytes = match (b == end && further > b).then(|| self.fetch(e, a, further)) {
                Some(Ok(more)) => {
                    let part = more[..(b - a) as usize].to_vec();
                    w.set(a, more);
                    part
                }
                _ => self.fetch(e, a, b)?,
            };
            buf[(a - offset) as usize..(b - offset) as usize].copy_from_slice(&bytes);
            done = b;
        }
        w.next = done.max(end);
        Ok((end - offset) as usize)
    }

    /// `[offset, end)` with one fetch per extent touched.
    fn fetch_exact(&self, offset: u64, end: u64, buf: &mut [u8]) -> Result<(), StorageError> {
        for e in &self.ext {
            let a = offset.max(e.slice.start);
            let b = end.min(e.end);
            if a >= b {
                continue;
            }
            let bytes = self.fetch(e, a, b)?;
            buf[(a - offset) as usize..(b - offset) as usize].copy_from_slice(&bytes);
        }
        Ok(())
    }

    /// Bytes `[a, b)` of the replica, inside extent `e`, their chunks
    /// verified: one request for their CRCs and one for their bytes (in
    /// parallel).
    fn fetch(&self, e: &Extent, a: u64, b: u64) -> Result<Vec<u8>, StorageError> {
        let s = &e.slice;
        let key = slice_key(self.block, self.gs, s);
        if e.size != s.object_len() {
            return Err(self.corrupt(s.start));
        }
        let c0 = (a - s.start) / CS;
        let c1 = (b - s.start).div_ceil(CS);
        let d0 = c0 * CS;
        let d1 = (c1 * CS).min(s.end - s.start);
        let m = SLICE_MAGIC.len() as u64;
        let ranges = [m + 4 * c0..m + 4 * c1, s.data_at() + d0..s.data_at() + d1];
        let got = self.bucket.get_ranges(&key, &ranges)?;
        let (crcs, data) = match got.as_slice() {
            [c, d] if c.len() as u64 == 4 * (c1 - c0) && d.len() as u64 == d1 - d0 => (c, d),
            _ => return Err(self.corrupt(s.start + d0)),
        };
        for (i, chunk) in data.chunks(CHUNK_SIZE).enumerate() {
            let want = u32::from_be_bytes([
                crcs[4 * i],
                crcs[4 * i + 1],
                crcs[4 * i + 2],
                crcs[4 * i + 3],
            ]);
            if crc(chunk) != want {
                return Err(self.corrupt(s.start + d0 + i as u64 * CS));
            }
        }
        let from = (a - s.start - d0) as usize;
        Ok(data[from..from + (b - a) as usize].to_vec())
    }

    /// The longest prefix whose chunks check out (slices are written whole
    /// or not at all, so there is no torn tail: a bad chunk is damage).
    pub fn valid_prefix(&self) -> Result<u64, StorageError> {
        const PIECE: usize = 1 << 20;
        let mut buf = vec![0u8; PIECE];
        let mut off = 0u64;
        loop {
            match self.read_verified(off, &mut buf) {
                Ok(0) => return Ok(off),
                Ok(n) => off += n as u64,
                Err(StorageError::Corrupt { offset, .. }) => return Ok(offset),
                Err(e) => return Err(e),
            }
        }
    }

    fn corrupt(&self, offset: u64) -> StorageError {
        StorageError::Corrupt {
            block: self.block,
            replica: self.path.clone(),
            offset,
        }
    }
}
