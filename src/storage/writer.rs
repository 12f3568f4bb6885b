//! [`ReplicaWriter`]: the open data and meta files of one replica being
//! written (rbw), appended to packet by packet.
//!
//! Ordering contract with [`super::reader`]: the writer writes a packet's
//! data before its checksums, and the reader reads checksums before data.
//! A reader that sees a checksum therefore also sees the bytes it covers;
//! it may see bytes that no checksum covers yet, which it never serves.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::api::{ReplicaWrite, SyncTask};
use super::checksum::{CHUNK_SIZE, chunk_count, crc_offset};
use super::error::StorageError;
use super::fsops::fsync_dir;
use crate::metrics::IoCounters;
use crate::sync::{Arc, AtomicBool, Ordering};

const CS: u64 = CHUNK_SIZE as u64;

/// Owns the open data and meta files of one replica being written (rbw).
///
/// Writes are appends at its length; each packet costs exactly two
/// `pwrite`s and never reads anything back. Renaming the meta file
/// (generation stamp bump) while the writer is open is fine: it writes
/// through its file descriptor.
#[derive(Debug)]
pub struct ReplicaWriter {
    block: u64,
    data: File,
    meta: File,
    data_path: PathBuf,
    /// The meta file's path when opened (for messages: a generation stamp
    /// bump renames it).
    meta_path: PathBuf,
    /// The directory holding the replica (the data file's parent), fsynced
    /// on the first `sync`.
    dir: PathBuf,
    len: u64,
    /// Reused buffer for the big-endian CRCs of a packet.
    meta_buf: Vec<u8>,
    synced_once: AtomicBool,
    /// The partial last chunk found when the replica was reopened.
    resume_tail: Vec<u8>,
    /// Its datanode's counters.
    io: Arc<IoCounters>,
}

/// The open files of a replica, as [`ReplicaWriter::new`] takes them.
pub(crate) struct ReplicaFiles {
    pub data: File,
    pub meta: File,
    pub data_path: PathBuf,
    pub meta_path: PathBuf,
}

impl ReplicaWriter {
    /// A writer appending at `len` to the replica of `block` in `files`,
    /// counting its bytes and failures in `io` (its datanode's).
    pub(crate) fn new(
        block: u64,
        files: ReplicaFiles,
        len: u64,
        resume_tail: Vec<u8>,
        io: &Arc<IoCounters>,
    ) -> Self {
        let ReplicaFiles {
            data,
            meta,
            data_path,
            meta_path,
        } = files;
        let dir = data_path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        Self {
            block,
            data,
            meta,
            data_path,
            meta_path,
            dir,
            len,
            meta_buf: Vec::new(),
            synced_once: AtomicBool::new(false),
            resume_tail,
            io: io.clone(),
        }
    }

    /// The block this replica belongs to.
    pub fn block(&self) -> u64 {
        self.block
    }

    /// The data file's path.
    pub fn path(&self) -> &Path {
        &self.data_path
    }

    fn append(&mut self, offset: u64, data: &[u8], crcs: &[u32]) -> Result<(), StorageError> {
        if offset != self.len {
            return Err(self.bad_packet(format!(
                "packet at offset {offset}, but the replica ends at {}",
                self.len
            )));
        }
        let end = offset + data.len() as u64;
        let first = offset / CS;
        let want = if data.is_empty() {
            0
        } else {
            chunk_count(end) - first
        };
        if crcs.len() as u64 != want {
            return Err(self.bad_packet(format!(
                "{} checksums for {} bytes at offset {offset}, expected {want}",
                crcs.len(),
                data.len()
            )));
        }
        if data.is_empty() {
            return Ok(());
        }
        self.data
            .write_all_at(data, offset)
            .map_err(|e| StorageError::io(&self.data_path, e))?;
        self.meta_buf.clear();
        for c in crcs {
            self.meta_buf.extend_from_slice(&c.to_be_bytes());
        }
        self.meta
            .write_all_at(&self.meta_buf, crc_offset(first))
            .map_err(|e| StorageError::io(&self.meta_path, e))?;
        self.len = end;
        Ok(())
    }

    fn bad_packet(&self, reason: String) -> StorageError {
        StorageError::BadPacket {
            path: self.data_path.clone(),
            reason,
        }
    }
}

impl ReplicaWrite for ReplicaWriter {
    fn len(&self) -> u64 {
        self.len
    }

    /// Data goes first, then the checksums, each in one `pwrite`; garbage
    /// a failure leaves past the length is cut by the next reopen.
    fn write_packet(&mut self, offset: u64, data: &[u8], crcs: &[u32]) -> Result<(), StorageError> {
        let r = self.append(offset, data, crcs);
        match &r {
            Ok(()) => self.io.wrote(data.len() as u64),
            Err(_) => self.io.error(),
        }
        r
    }

    /// `fdatasync` of data and checksums; the first time a full `fsync`
    /// of both and of the directory, so that the new directory entries
    /// survive a crash too.
    fn sync_tasks(&self) -> Result<Vec<SyncTask>, StorageError> {
        let first = !self.synced_once.swap(true, Ordering::AcqRel);
        let mut v: Vec<SyncTask> = Vec::new();
        for (file, path) in [(&self.data, &self.data_path), (&self.meta, &self.meta_path)] {
            let f = file.try_clone().map_err(|e| StorageError::io(path, e))?;
            let p = path.clone();
            v.push(Box::new(move || {
                let r = if first { f.sync_all() } else { f.sync_data() };
                r.map_err(|e| StorageError::io(&p, e))
            }));
        }
        if first {
            let dir = self.dir.clone();
            v.push(Box::new(move || fsync_dir(&dir)));
        }
        Ok(v)
    }

    fn take_resume_tail(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.resume_tail)
    }
}
