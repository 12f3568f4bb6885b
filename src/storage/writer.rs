//! [`ReplicaWriter`]: the open data and meta files of one replica being
//! written (rbw), appended to packet by packet, and made durable at each
//! fsync.
//!
//! A sync of appends writes the new data and its checksums, and, for files
//! that grew, their new size and blocks: on a local filesystem that is an
//! inode, a bitmap and the data of two files, written one after the other
//! (`fdatasync` writes the data, waits, then the metadata). A writer that
//! syncs often zero-fills its files ahead of itself instead
//! ([`ReplicaWrite::extend_zeroed`]: size and blocks made durable once per
//! stretch), and its later syncs only write back the pages that changed
//! (`sync_file_range`) and leave the cache flush to one `fdatasync` per
//! device ([`SyncPlan::Ranged`]). Such files are longer than the data
//! they hold until the writer finishes; the checksums say where the data
//! ends (see [`super::reader`]).
//!
//! Ordering contract with [`super::reader`]: the writer writes a packet's
//! data before its checksums, and the reader reads checksums before data.
//! A reader that sees a checksum therefore also sees the bytes it covers;
//! it may see bytes that no checksum covers yet, which it never serves.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::api::{ReplicaWrite, SyncPlan, SyncStep, SyncTask};
use super::at::At;
use super::checksum::{CHUNK_SIZE, chunk_count, crc, crc_offset, meta_len_for};
use super::error::StorageError;
use super::note::{NOTE_LEN, Note};
use crate::metrics::{Fast, IoCounters};
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
    len: u64,
    /// Reused buffer for the big-endian CRCs of a packet.
    meta_buf: Vec<u8>,
    synced_once: AtomicBool,
    /// Data bytes known durable, and the length the sync under way will
    /// make durable.
    synced_len: u64,
    pending: Option<u64>,
    /// Data bytes the files are durably allocated for (see
    /// [`ReplicaWrite::zeroed`]).
    zeroed: u64,
    /// The files were zero-filled past the data at some point.
    filled: bool,
    /// The partial last chunk found when the replica was reopened.
    resume_tail: Vec<u8>,
    /// The CRC of the partial last chunk (when `len` ends inside one).
    last_crc: u32,
    /// The sync note (see [`super::note`]): where it goes (in `rbw/`, the
    /// replica's directory, fsynced through its descriptor on the first
    /// `sync`), the file once
    /// written, what it says, whether its name and size are durable, and
    /// whether the sync under way wrote it.
    note_at: At,
    note: Option<File>,
    noted: Option<Note>,
    note_durable: bool,
    note_pending: bool,
    /// Its datanode's counters.
    io: Arc<IoCounters>,
}

/// The open files of a replica, as [`ReplicaWriter::new`] takes them.
pub(crate) struct ReplicaFiles {
    pub data: File,
    pub meta: File,
    pub data_path: PathBuf,
    pub meta_path: PathBuf,
    /// Where its sync note goes (in the replica's directory, `rbw/`).
    pub note: At,
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
            note: note_at,
        } = files;
        let last_crc = crc(&resume_tail);
        Self {
            block,
            data,
            meta,
            data_path,
            meta_path,
            len,
            meta_buf: Vec::new(),
            synced_once: AtomicBool::new(false),
            synced_len: 0,
            pending: None,
            zeroed: 0,
            filled: false,
            resume_tail,
            last_crc,
            note_at,
            note: None,
            noted: None,
            note_durable: false,
            note_pending: false,
            io: io.clone(),
        }
    }

    /// The sync note on disk already says `note`, durably.
    pub(crate) fn with_note(mut self, note: Option<Note>) -> Self {
        if note.is_some() {
            self.noted = note;
            self.note_durable = true;
        }
        self
    }

    /// The block this replica belongs to.
    pub fn block(&self) -> u64 {
        self.block
    }

    /// The data file's path.
    pub fn path(&self) -> &Path {
        &self.data_path
    }

    /// Checks that `len` bytes at `offset` with `crcs` continue the
    /// replica.
    fn check_packet(&self, offset: u64, len: u64, crcs: &[u32]) -> Result<(), StorageError> {
        if offset != self.len {
            return Err(self.bad_packet(format!(
                "packet at offset {offset}, but the replica ends at {}",
                self.len
            )));
        }
        let want = if len == 0 {
            0
        } else {
            chunk_count(offset + len) - offset / CS
        };
        if crcs.len() as u64 != want {
            return Err(self.bad_packet(format!(
                "{} checksums for {len} bytes at offset {offset}, expected {want}",
                crcs.len(),
            )));
        }
        Ok(())
    }

    fn append(&mut self, offset: u64, data: &[u8], crcs: &[u32]) -> Result<(), StorageError> {
        self.check_packet(offset, data.len() as u64, crcs)?;
        if data.is_empty() {
            return Ok(());
        }
        self.data
            .write_all_at(data, offset)
            .map_err(|e| StorageError::io(&self.data_path, e))?;
        self.put_crcs(offset, data.len() as u64, crcs)
    }

    /// Zeros as a hole: the data file is only made longer (the filesystem
    /// reads a hole as zeros, before and after a crash, and allocates
    /// nothing for it); what lies past the length already is zeros of a
    /// fill (the writer never leaves data there). Then the checksums, as
    /// for data: after the bytes they cover.
    fn append_zeros(&mut self, offset: u64, len: u64, crcs: &[u32]) -> Result<(), StorageError> {
        self.check_packet(offset, len, crcs)?;
        if len == 0 {
            return Ok(());
        }
        let end = offset
            .checked_add(len)
            .ok_or_else(|| self.bad_packet(format!("{len} zeros at offset {offset} overflow")))?;
        if super::fsops::file_len(&self.data, &self.data_path)? < end {
            self.data
                .set_len(end)
                .map_err(|e| StorageError::io(&self.data_path, e))?;
        }
        self.put_crcs(offset, len, crcs)
    }

    /// Writes the checksums of `len` bytes at `offset`, which the data
    /// file now holds, and moves the length past them.
    fn put_crcs(&mut self, offset: u64, len: u64, crcs: &[u32]) -> Result<(), StorageError> {
        self.meta_buf.clear();
        for c in crcs {
            self.meta_buf.extend_from_slice(&c.to_be_bytes());
        }
        self.meta
            .write_all_at(&self.meta_buf, crc_offset(offset / CS))
            .map_err(|e| StorageError::io(&self.meta_path, e))?;
        self.len = offset + len;
        if let Some(&last) = crcs.last() {
            self.last_crc = last;
        }
        Ok(())
    }

    /// Before a sync that ends inside a chunk: the note says where, with
    /// the chunk's CRC (in place once the file exists). Returns whether the
    /// note was written now.
    fn write_note(&mut self) -> Result<bool, StorageError> {
        let note = Note {
            len: self.len,
            crc: self.last_crc,
        };
        if self.len.is_multiple_of(CS) || self.noted == Some(note) {
            return Ok(false);
        }
        if self.note.is_none() {
            self.note = Some(self.note_at.create(false)?);
        }
        let f = self.note.as_ref().expect("opened above");
        f.write_all_at(&note.encode(), 0)
            .map_err(|e| StorageError::io(&self.note_at.path, e))?;
        self.noted = Some(note);
        Ok(true)
    }

    /// `sync_file_range` with `flags` over what was written since the last
    /// sync: the data, and the checksums from the chunk it ended in.
    fn writeback(&self, flags: libc::c_uint) -> Result<(), StorageError> {
        const PAGE: u64 = 4096;
        let from = self.synced_len / PAGE * PAGE;
        let meta_from = crc_offset(self.synced_len / CS) / PAGE * PAGE;
        let meta_to = crc_offset(chunk_count(self.len));
        for (file, path, a, b) in [
            (&self.data, &self.data_path, from, self.len),
            (&self.meta, &self.meta_path, meta_from, meta_to),
        ] {
            if b > a {
                sync_file_range(file, a, b - a, flags).map_err(|e| StorageError::io(path, e))?;
            }
        }
        if let Some(note) = self.note.as_ref().filter(|_| self.note_pending) {
            sync_file_range(note, 0, NOTE_LEN as u64, flags)
                .map_err(|e| StorageError::io(&self.note_at.path, e))?;
        }
        Ok(())
    }

    fn bad_packet(&self, reason: String) -> StorageError {
        StorageError::BadPacket {
            path: self.data_path.clone(),
            reason,
        }
    }
}

/// `sync_file_range(2)` of `len` bytes at `off`.
fn sync_file_range(f: &File, off: u64, len: u64, flags: libc::c_uint) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: a plain system call on a descriptor `f` keeps open; it
    // touches no memory of ours.
    let r = unsafe { libc::sync_file_range(f.as_raw_fd(), off as i64, len as i64, flags) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
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

    fn write_zeros(&mut self, offset: u64, len: u64, crcs: &[u32]) -> Result<(), StorageError> {
        let r = self.append_zeros(offset, len, crcs);
        if r.is_err() {
            self.io.error();
        }
        r
    }

    /// Ranged when the datanode allows it and everything written since
    /// the last sync lies in the zero-filled stretch (and the files' names
    /// are durable: not before the first full sync, nor the sync that
    /// first writes the note); else `fdatasync` of data and checksums (and
    /// the note), the first time a full `fsync` of both and of the
    /// directory, so that the new directory entries survive a crash too.
    fn begin_sync(&mut self, ranged: bool) -> Result<SyncPlan, StorageError> {
        let once = self.synced_once.load(Ordering::Acquire);
        if once && self.len == self.synced_len {
            return Ok(SyncPlan::Clean);
        }
        self.pending = Some(self.len);
        self.note_pending = self.write_note()?;
        let new_note = self.note_pending && !self.note_durable;
        if ranged && once && self.len <= self.zeroed && !new_note {
            self.writeback(libc::SYNC_FILE_RANGE_WRITE)?;
            self.io.fast(Fast::SyncRanged);
            return Ok(SyncPlan::Ranged);
        }
        let first = !self.synced_once.swap(true, Ordering::AcqRel);
        let mut v: Vec<SyncTask> = Vec::new();
        let note = self.note.as_ref().filter(|_| self.note_pending);
        let files = [(&self.data, &self.data_path), (&self.meta, &self.meta_path)]
            .into_iter()
            .chain(note.map(|n| (n, &self.note_at.path)));
        for (file, path) in files {
            let f = file.try_clone().map_err(|e| StorageError::io(path, e))?;
            let p = path.clone();
            let all = first || (new_note && *path == self.note_at.path);
            v.push(SyncTask::new(SyncStep::File, move || {
                let r = if all { f.sync_all() } else { f.sync_data() };
                r.map_err(|e| StorageError::io(&p, e))
            }));
        }
        if first || new_note {
            let note_at = self.note_at.clone();
            v.push(SyncTask::new(SyncStep::Dir, move || note_at.fsync_dir()));
        }
        self.io.fast(Fast::SyncFull);
        Ok(SyncPlan::Full(v))
    }

    fn end_ranged(&self) -> Result<(), StorageError> {
        self.writeback(
            libc::SYNC_FILE_RANGE_WAIT_BEFORE
                | libc::SYNC_FILE_RANGE_WRITE
                | libc::SYNC_FILE_RANGE_WAIT_AFTER,
        )
    }

    fn flush(&self) -> Result<(), StorageError> {
        self.data
            .sync_data()
            .map_err(|e| StorageError::io(&self.data_path, e))
    }

    fn synced(&mut self) {
        if std::mem::take(&mut self.note_pending) {
            self.note_durable = true;
        }
        if let Some(len) = self.pending.take() {
            self.synced_len = len;
            // A full sync made the blocks up to here durable too.
            self.zeroed = self.zeroed.max(len);
        }
    }

    fn zeroed(&self) -> u64 {
        self.zeroed
    }

    /// Zeros go after whatever the files hold (data, or earlier zeros), in
    /// pieces of 1 MiB from one buffer; then both files are synced.
    fn extend_zeroed(&mut self, to: u64) -> Result<(), StorageError> {
        if to <= self.zeroed {
            return Ok(());
        }
        // Before the first zero: a fill that fails part way leaves the
        // files longer than the data too, and finishing must cut them.
        self.filled = true;
        self.io.fast(Fast::ZeroFill);
        let zeros = vec![0u8; 1 << 20];
        for (file, path, want) in [
            (&self.data, &self.data_path, to),
            (&self.meta, &self.meta_path, meta_len_for(to)),
        ] {
            let mut at = super::fsops::file_len(file, path)?;
            while at < want {
                let n = (want - at).min(zeros.len() as u64) as usize;
                file.write_all_at(&zeros[..n], at)
                    .map_err(|e| StorageError::io(path, e))?;
                at += n as u64;
            }
            file.sync_data().map_err(|e| StorageError::io(path, e))?;
        }
        self.zeroed = to;
        Ok(())
    }

    /// Bytes written over the zero-filled stretch since the last sync are
    /// synced before the cut: they overwrite blocks the files already
    /// have, which the filesystem may write back after the cut reached the
    /// disk (see [`super::replica`]'s `shrink`).
    fn finish(self: Box<Self>) -> Result<u64, StorageError> {
        if self.filled {
            if self.len > self.synced_len {
                for (file, path) in [(&self.data, &self.data_path), (&self.meta, &self.meta_path)] {
                    file.sync_data().map_err(|e| StorageError::io(path, e))?;
                }
            }
            self.data
                .set_len(self.len)
                .map_err(|e| StorageError::io(&self.data_path, e))?;
            self.meta
                .set_len(meta_len_for(self.len))
                .map_err(|e| StorageError::io(&self.meta_path, e))?;
        }
        Ok(self.len)
    }

    fn take_resume_tail(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.resume_tail)
    }
}
