//! The sync note of a replica: where its last sync that ended inside a
//! checksum chunk ended, and that partial chunk's CRC then.
//!
//! A sync that ends at byte `S` inside chunk `k` makes that chunk's CRC (of
//! its first `S % 512` bytes) durable in the checksum file. The next append
//! into the chunk rewrites that CRC in place, for the longer chunk; if the
//! new CRC reaches the disk and the appended bytes do not (a power cut
//! between two writebacks), the chunk matches neither, and a replica's
//! valid prefix would end at the chunk's start, below what was fsynced, on
//! every replica alike. HDFS keeps the last partial chunk's previous
//! checksum for this; leasefs keeps it in the note, made durable by the
//! same sync, so the fsynced prefix of the chunk can still be verified.
//!
//! `rbw/blk_<id>.last`, 16 bytes: `S` (u64 BE), the CRC32C of the chunk's
//! first `S % 512` bytes (u32 BE), and the CRC32C of those 12 bytes. It is
//! written (in place, so a ranged sync covers it) only by syncs that end
//! inside a chunk, and read only when a chunk fails its checksum. A note
//! is a true statement about the bytes it covers whatever happened since:
//! it is used only where they still match it. It goes with its block's
//! files; other releases leave it alone (not a replica file name).

use super::at::At;
use super::checksum::{CHUNK_SIZE, crc};
use super::error::StorageError;

/// Bytes of a note file.
pub(crate) const NOTE_LEN: usize = 16;

/// Where a replica's last sync inside a chunk ended, and the CRC of that
/// chunk's bytes then.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Note {
    pub len: u64,
    pub crc: u32,
}

impl Note {
    pub fn encode(&self) -> [u8; NOTE_LEN] {
        let mut b = [0u8; NOTE_LEN];
        b[..8].copy_from_slice(&self.len.to_be_bytes());
        b[8..12].copy_from_slice(&self.crc.to_be_bytes());
        let check = crc(&b[..12]);
        b[12..].copy_from_slice(&check.to_be_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Option<Note> {
        let b: &[u8; NOTE_LEN] = b.get(..NOTE_LEN)?.try_into().ok()?;
        let check = u32::from_be_bytes([b[12], b[13], b[14], b[15]]);
        (crc(&b[..12]) == check).then(|| Note {
            len: u64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]),
            crc: u32::from_be_bytes([b[8], b[9], b[10], b[11]]),
        })
    }

    /// Writes the note at `at` and makes it durable (its name too, in
    /// its directory, when the file is new), before anything may rewrite
    /// the CRC it keeps.
    pub fn write_durably(&self, at: &At) -> Result<(), StorageError> {
        use std::os::unix::fs::FileExt;
        let new = !at.exists()?;
        let f = at.create(false)?;
        f.write_all_at(&self.encode(), 0)
            .and_then(|()| f.sync_data())
            .map_err(|e| StorageError::io(&at.path, e))?;
        if new {
            at.fsync_dir()?;
        }
        Ok(())
    }

    /// The note at `at`, if there is a whole one.
    pub fn read(at: &At) -> Option<Note> {
        let f = at.open_read().ok()?;
        let mut b = [0u8; NOTE_LEN];
        let n = super::fsops::read_full_at(&f, &mut b, 0).ok()?;
        Note::decode(&b[..n])
    }

    /// How many of `bytes`, the chunk of the replica starting at byte
    /// `start`, the note vouches for: the synced part of it, when those
    /// bytes still match the CRC it kept.
    pub fn covers(&self, start: u64, bytes: &[u8]) -> Option<usize> {
        let p = self.len.checked_sub(start)? as usize;
        (p > 0 && p < CHUNK_SIZE && p <= bytes.len() && crc(&bytes[..p]) == self.crc).then_some(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_note_vouches_only_for_the_bytes_it_kept_the_crc_of() {
        let chunk: Vec<u8> = (0..512u32).map(|i| i as u8).collect();
        let n = Note {
            len: 1024 + 300,
            crc: crc(&chunk[..300]),
        };
        let b = n.encode();
        assert_eq!(Note::decode(&b), Some(n));
        let mut torn = b;
        torn[3] ^= 1;
        assert_eq!(Note::decode(&torn), None);
        assert_eq!(n.covers(1024, &chunk), Some(300));
        assert_eq!(n.covers(1024, &chunk[..200]), None, "bytes missing");
        assert_eq!(n.covers(512, &chunk), None, "another chunk");
        let mut other = chunk.clone();
        other[7] ^= 1;
        assert_eq!(n.covers(1024, &other), None, "bytes changed");
    }
}
