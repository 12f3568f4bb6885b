//! [`ObjectWriter`]: a replica being written to an object store. Each
//! packet becomes one immutable slice object, PUT before the packet is
//! acknowledged: the pipeline's ack then means the bytes are both visible
//! to readers on every host and durable in the store, so a sync has
//! nothing left to do.

use super::super::api::{ReplicaWrite, SyncPlan};
use super::super::checksum::{CHUNK_SIZE, chunk_count};
use super::super::error::StorageError;
use super::bucket::Bucket;
use super::keys::{SLICE_MAGIC, SliceName, slice_key};
use crate::metrics::IoCounters;
use crate::sync::Arc;

/// A replica open for appends.
#[derive(Debug)]
pub struct ObjectWriter {
    pub(super) bucket: Arc<Bucket>,
    pub(super) io: Arc<IoCounters>,
    pub(super) block: u64,
    pub(super) gs: u64,
    /// The next slice's sequence number.
    pub(super) seq: u64,
    pub(super) len: u64,
    /// The bytes of the partial chunk at the end (since the last chunk
    /// boundary): the next slice starts at that boundary and holds them
    /// again, so that its first chunk's CRC covers bytes it holds.
    pub(super) tail: Vec<u8>,
    /// The tail as found when reopened, for the caller's CRC accumulator.
    pub(super) resume: Vec<u8>,
}

/// A slice object's bytes: magic, CRCs, data.
pub(super) fn encode_slice(crcs: &[u32], parts: &[&[u8]]) -> Vec<u8> {
    let n: usize = parts.iter().map(|p| p.len()).sum();
    let mut body = Vec::with_capacity(SLICE_MAGIC.len() + 4 * crcs.len() + n);
    body.extend_from_slice(SLICE_MAGIC);
    body.extend(crcs.iter().flat_map(|c| c.to_be_bytes()));
    for p in parts {
        body.extend_from_slice(p);
    }
    body
}

impl ObjectWriter {
    fn bad(&self, reason: String) -> StorageError {
        StorageError::BadPacket {
            path: self
                .bucket
                .path_of(&super::keys::gen_dir(self.block, self.gs)),
            reason,
        }
    }

    fn append(&mut self, offset: u64, data: &[u8], crcs: &[u32]) -> Result<(), StorageError> {
        if offset != self.len {
            return Err(self.bad(format!(
                "packet at offset {offset}, replica length {}",
                self.len
            )));
        }
        let start = self.len - self.tail.len() as u64;
        let end = self.len + data.len() as u64;
        let s = SliceName {
            seq: self.seq,
            start,
            end,
        };
        if crcs.len() as u64 != chunk_count(end - start) {
            return Err(self.bad(format!(
                "{} CRCs for {} bytes from a chunk boundary",
                crcs.len(),
                end - start
            )));
        }
        let body = encode_slice(crcs, &[&self.tail, data]);
        let r = self.bucket.put(&slice_key(self.block, self.gs, &s), body);
        if r.is_err() {
            self.io.error();
        }
        r?;
        self.io.wrote(data.len() as u64);
        self.seq += 1;
        self.len = end;
        let keep = (end % CHUNK_SIZE as u64) as usize;
        let mut all = std::mem::take(&mut self.tail);
        all.extend_from_slice(data);
        self.tail = all[all.len() - keep.min(all.len())..].to_vec();
        Ok(())
    }
}

impl ReplicaWrite for ObjectWriter {
    fn len(&self) -> u64 {
        self.len
    }

    fn write_packet(&mut self, offset: u64, data: &[u8], crcs: &[u32]) -> Result<(), StorageError> {
        self.append(offset, data, crcs)
    }

    /// An object store has no holes: the zeros are written.
    fn write_zeros(&mut self, offset: u64, len: u64, crcs: &[u32]) -> Result<(), StorageError> {
        let zeros =
            vec![0u8; usize::try_from(len).map_err(|_| self.bad(format!("{len} zero bytes")))?];
        self.append(offset, &zeros, crcs)
    }

    /// Every slice was acknowledged by the store when written.
    fn begin_sync(&mut self, _ranged: bool) -> Result<SyncPlan, StorageError> {
        Ok(SyncPlan::Clean)
    }

    fn end_ranged(&self) -> Result<(), StorageError> {
        Ok(())
    }

    fn flush(&self) -> Result<(), StorageError> {
        Ok(())
    }

    fn synced(&mut self) {}

    /// Nothing is allocated ahead in an object store.
    fn zeroed(&self) -> u64 {
        0
    }

    /// Nothing to allocate ahead (see [`super::super::api::Storage::ranged_sync`],
    /// false here, so callers never plan ranged syncs on it).
    fn extend_zeroed(&mut self, _to: u64) -> Result<(), StorageError> {
        Ok(())
    }

    fn finish(self: Box<Self>) -> Result<u64, StorageError> {
        Ok(self.len)
    }

    fn take_resume_tail(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.resume)
    }
}
