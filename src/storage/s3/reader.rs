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
use crate::sync::Arc;

const CS: u64 = CHUNK_SIZE as u64;

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
        for e in &self.ext {
            let a = offset.max(e.slice.start);
            let b = end.min(e.end);
            if a >= b {
                continue;
            }
            let bytes = self.fetch(e, a, b)?;
            buf[(a - offset) as usize..(b - offset) as usize].copy_from_slice(&bytes);
        }
        Ok((end - offset) as usize)
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
