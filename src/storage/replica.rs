//! The open files of one replica: [`ReplicaWriter`] appends packets to a
//! replica being written, [`ReplicaReader`] serves checksum-verified reads
//! and computes the valid prefix used by lease recovery. Also the positional
//! I/O helpers and `shrink`, shared with [`super::datanode`].
//!
//! Ordering contract between the two: the writer writes a packet's data
//! before its checksums, and the reader reads checksums before data. A reader
//! that sees a checksum therefore also sees the bytes it covers; it may see
//! bytes that no checksum covers yet, which it never serves (see
//! [`longest_matching_prefix`]).

use std::fs::File;
use std::io::{self, IoSliceMut};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::checksum::{
    CHUNK_SIZE, CRC_LEN, META_HEADER_LEN, check_header_at, chunk_count, crc, crc_offset,
    longest_matching_prefix, meta_len_for,
};
use super::datanode::{ReplicaState, StorageError};
use crate::metrics::IoCounters;
use crate::sync::{Arc, AtomicBool, Ordering};

/// Re-exported for the write pipeline, which pairs it with the writer.
pub use super::checksum::ChunkAccumulator;

const CS: u64 = CHUNK_SIZE as u64;

/// Owns the open data and meta files of one replica being written (rbw).
///
/// Writes are appends at [`ReplicaWriter::len`]; each packet costs exactly two
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

/// One independent piece of a sync (see [`ReplicaWriter::sync_tasks`]).
pub type SyncTask = Box<dyn FnOnce() -> Result<(), StorageError> + Send>;

impl ReplicaWriter {
    pub(crate) fn new(
        block: u64,
        data: File,
        meta: File,
        data_path: PathBuf,
        meta_path: PathBuf,
        len: u64,
        resume_tail: Vec<u8>,
    ) -> Self {
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
            io: Arc::default(),
        }
    }

    /// Counts this writer's bytes and failures in `io` (its datanode's).
    pub(crate) fn counted(mut self, io: &Arc<IoCounters>) -> Self {
        self.io = io.clone();
        self
    }

    /// The block this replica belongs to.
    pub fn block(&self) -> u64 {
        self.block
    }

    /// Bytes written so far; the next packet must start here.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True when nothing has been written.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The data file's path.
    pub fn path(&self) -> &Path {
        &self.data_path
    }

    /// The bytes after the last 512-byte boundary when the replica was
    /// reopened for append (empty for a new replica), for
    /// [`super::checksum::ChunkAccumulator::resume`].
    pub fn take_resume_tail(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.resume_tail)
    }

    /// Appends `data` at `offset` (which must equal [`Self::len`]).
    ///
    /// `crcs` are the CRCs of the chunks from `offset / 512` to the end of
    /// `offset + data.len()`; when `offset` is mid-chunk, `crcs[0]` is the CRC
    /// of the whole chunk, old bytes and new. Data goes first, then the
    /// checksums, each in one `pwrite`. On error the length is unchanged;
    /// garbage past it is cut by the next reopen.
    pub fn write_packet(
        &mut self,
        offset: u64,
        data: &[u8],
        crcs: &[u32],
    ) -> Result<(), StorageError> {
        let r = self.append(offset, data, crcs);
        match &r {
            Ok(()) => self.io.wrote(data.len() as u64),
            Err(_) => self.io.error(),
        }
        r
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

    /// The work of [`Self::sync`] as independent tasks (data, checksums,
    /// and the directory the first time) that a caller can run in parallel
    /// with each other and with other replicas' syncs.
    pub fn sync_tasks(&self) -> Result<Vec<SyncTask>, StorageError> {
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

    /// Makes everything written durable: `fdatasync` of data and meta. The
    /// first call does a full `fsync` of both and of the directory, so the
    /// new directory entries survive a crash too.
    pub fn sync(&self) -> Result<(), StorageError> {
        if self.synced_once.load(Ordering::Acquire) {
            self.data
                .sync_data()
                .map_err(|e| StorageError::io(&self.data_path, e))?;
            self.meta
                .sync_data()
                .map_err(|e| StorageError::io(&self.meta_path, e))?;
        } else {
            self.data
                .sync_all()
                .map_err(|e| StorageError::io(&self.data_path, e))?;
            self.meta
                .sync_all()
                .map_err(|e| StorageError::io(&self.meta_path, e))?;
            fsync_dir(&self.dir)?;
            self.synced_once.store(true, Ordering::Release);
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

/// Open data and meta files of one replica with a known generation stamp,
/// for checksum-verified reads. Cheap to keep open across reads: finalizing
/// renames the files but not the inodes behind these descriptors.
#[derive(Debug)]
pub struct ReplicaReader {
    pub(crate) block: u64,
    pub(crate) gs: u64,
    pub(crate) state: ReplicaState,
    pub(crate) data: File,
    pub(crate) meta: File,
    pub(crate) data_path: PathBuf,
    pub(crate) meta_path: PathBuf,
    /// Its datanode's counters.
    pub(crate) io: Arc<IoCounters>,
}

impl ReplicaReader {
    /// The block this replica belongs to.
    pub fn block(&self) -> u64 {
        self.block
    }

    /// The generation stamp the reader was opened with.
    pub fn gs(&self) -> u64 {
        self.gs
    }

    /// Where the files were when opened.
    pub fn state(&self) -> ReplicaState {
        self.state
    }

    /// The data file's path when opened.
    pub fn data_path(&self) -> &Path {
        &self.data_path
    }

    /// The meta file's path when opened.
    pub fn meta_path(&self) -> &Path {
        &self.meta_path
    }

    /// Current length of the data file.
    pub fn data_len(&self) -> Result<u64, StorageError> {
        file_len(&self.data, &self.data_path)
    }

    /// How many bytes the replica holds with a checksum each could cover:
    /// the data, cut to what the checksum file has room for.
    pub fn present_len(&self) -> Result<u64, StorageError> {
        let meta_len = file_len(&self.meta, &self.meta_path)?;
        let ncrc = meta_len.saturating_sub(META_HEADER_LEN) / CRC_LEN;
        Ok(self.data_len()?.min(ncrc * CS))
    }

    /// Reads up to `buf.len()` bytes at `offset`, verifying the CRC of every
    /// chunk touched. Whole chunks are read internally with one vectored
    /// `pread` of the data (straight into `buf`, the partial chunks at either
    /// end into scratch space) and one `pread` of the checksums.
    ///
    /// Returns fewer bytes at the end of the data, and, for a replica being
    /// written, at the end of what the checksums cover. A mismatch gives
    /// [`StorageError::Corrupt`] with the offset of the bad chunk.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<usize, StorageError> {
        let r = self.read_verified(offset, buf);
        match &r {
            Ok(n) => self.io.read(*n as u64),
            // The last chunk of a replica being written may be read between
            // its data and its checksum: readers retry, it is no failure.
            Err(StorageError::Corrupt { .. }) if self.state == ReplicaState::Rbw => {}
            Err(_) => self.io.error(),
        }
        r
    }

    fn read_verified(&self, offset: u64, buf: &mut [u8]) -> Result<usize, StorageError> {
        if buf.is_empty() {
            return Ok(0);
        }
        let end = offset + buf.len() as u64;
        let first = offset / CS;
        let chunks = (chunk_count(end) - first) as usize;
        let chunk_start = first * CS;

        // Checksums first (see the module doc). With the first chunk, read
        // the header in the same call and check it.
        let hdr = if first == 0 {
            META_HEADER_LEN as usize
        } else {
            0
        };
        let need = hdr + chunks * CRC_LEN as usize;
        let mut small = [0u8; 8 + 256 * 4];
        let mut big = Vec::new();
        let mbuf: &mut [u8] = if need <= small.len() {
            &mut small[..need]
        } else {
            big.resize(need, 0);
            &mut big
        };
        let meta_at = if first == 0 { 0 } else { crc_offset(first) };
        let mgot = read_full_at(&self.meta, mbuf, meta_at)
            .map_err(|e| StorageError::io(&self.meta_path, e))?;
        if hdr > 0 {
            check_header_at(&mbuf[..mgot.min(hdr)], &self.meta_path)?;
        }
        let crcs = &mbuf[hdr..mgot.max(hdr)];
        let ncrc = crcs.len() / CRC_LEN as usize;

        // Then the data: [head | buf | tail] covers whole chunks.
        let head_len = (offset - chunk_start) as usize;
        let tail_len = (chunk_count(end) * CS - end) as usize;
        let mut head = [0u8; CHUNK_SIZE];
        let mut tail = [0u8; CHUNK_SIZE];
        let got = {
            let mut iov = [
                IoSliceMut::new(&mut head[..head_len]),
                IoSliceMut::new(buf),
                IoSliceMut::new(&mut tail[..tail_len]),
            ];
            preadv_full(&self.data, &mut iov, chunk_start)
                .map_err(|e| StorageError::io(&self.data_path, e))?
        };

        let mut avail = got;
        if ncrc < got.div_ceil(CHUNK_SIZE) {
            // A replica being written may have data whose checksums are not
            // written yet: serve only what is covered.
            if !self.being_written() {
                return Err(self.corrupt(chunk_start + (ncrc * CHUNK_SIZE) as u64));
            }
            avail = ncrc * CHUNK_SIZE;
        }
        if avail <= head_len {
            return Ok(0);
        }
        let want_end = head_len + buf.len();
        let segs: [&[u8]; 3] = [&head[..head_len], buf, &tail[..tail_len]];
        let nchunks = avail.div_ceil(CHUNK_SIZE);
        let mut scratch = [0u8; CHUNK_SIZE];
        for i in 0..nchunks {
            let a = i * CHUNK_SIZE;
            let b = (a + CHUNK_SIZE).min(avail);
            let bytes = chunk_bytes(&segs, a, b, &mut scratch);
            let c = &crcs[i * 4..i * 4 + 4];
            let stored = u32::from_be_bytes([c[0], c[1], c[2], c[3]]);
            if crc(bytes) == stored {
                continue;
            }
            if i + 1 == nchunks
                && self.being_written()
                && let Some(k) = longest_matching_prefix(bytes, 0, stored)
            {
                avail = a + k;
                continue;
            }
            return Err(self.corrupt(chunk_start + a as u64));
        }
        Ok(avail.min(want_end).saturating_sub(head_len))
    }

    /// The longest prefix of the data whose chunks match their CRCs: stops
    /// at the first bad chunk, at the end of the data, or at the end of the
    /// checksums. The last checksummed chunk counts up to the longest prefix
    /// its CRC covers (a crash between a packet's data and checksum writes
    /// leaves more data than checksums).
    pub fn valid_prefix(&self) -> Result<u64, StorageError> {
        let mut h = [0u8; META_HEADER_LEN as usize];
        let n = read_full_at(&self.meta, &mut h, 0)
            .map_err(|e| StorageError::io(&self.meta_path, e))?;
        check_header_at(&h[..n], &self.meta_path)?;
        let meta_len = file_len(&self.meta, &self.meta_path)?;
        let ncrc = meta_len.saturating_sub(META_HEADER_LEN) / CRC_LEN;
        let data_len = self.data_len()?;
        let limit = ncrc.min(chunk_count(data_len));

        const BATCH: u64 = 2048; // 1 MiB of data per pair of reads
        let batch = BATCH.min(limit);
        let mut data = vec![0u8; (batch * CS) as usize];
        let mut meta = vec![0u8; (batch * CRC_LEN) as usize];
        let mut c = 0u64;
        while c < limit {
            let n = batch.min(limit - c) as usize;
            let mgot = read_full_at(&self.meta, &mut meta[..n * 4], crc_offset(c))
                .map_err(|e| StorageError::io(&self.meta_path, e))?;
            let dgot = read_full_at(&self.data, &mut data[..n * CHUNK_SIZE], c * CS)
                .map_err(|e| StorageError::io(&self.data_path, e))?;
            for j in 0..n.min(mgot / 4) {
                let a = j * CHUNK_SIZE;
                let start = (c + j as u64) * CS;
                if a >= dgot {
                    return Ok(start);
                }
                let b = (a + CHUNK_SIZE).min(dgot);
                let bytes = &data[a..b];
                let m = &meta[j * 4..j * 4 + 4];
                let stored = u32::from_be_bytes([m[0], m[1], m[2], m[3]]);
                let last = c + j as u64 + 1 == ncrc || b - a < CHUNK_SIZE;
                if !last {
                    if crc(bytes) != stored {
                        return Ok(start);
                    }
                    continue;
                }
                let k = longest_matching_prefix(bytes, 0, stored).unwrap_or(0);
                return Ok(start + k as u64);
            }
            if mgot / 4 < n {
                return Ok((c + (mgot / 4) as u64) * CS);
            }
            c += n as u64;
        }
        Ok(c * CS)
    }

    /// Whether the replica may be growing under this reader: it was opened
    /// in `rbw/`, or was finalized but has since been moved back there for
    /// an append (checked only when the data outruns the checksums, so the
    /// common path costs nothing).
    fn being_written(&self) -> bool {
        self.state == ReplicaState::Rbw || !(self.data_path.exists() && self.meta_path.exists())
    }

    fn corrupt(&self, offset: u64) -> StorageError {
        StorageError::Corrupt {
            block: self.block,
            replica: self.data_path.clone(),
            offset,
        }
    }
}

/// Bytes `[a, b)` of the concatenation of `segs`: borrowed when they lie in
/// one segment, copied into `scratch` (at most one chunk) when they straddle.
fn chunk_bytes<'s>(
    segs: &[&'s [u8]; 3],
    a: usize,
    b: usize,
    scratch: &'s mut [u8; CHUNK_SIZE],
) -> &'s [u8] {
    let mut base = 0;
    for s in segs {
        if a >= base && b <= base + s.len() {
            return &s[a - base..b - base];
        }
        base += s.len();
    }
    let mut base = 0;
    for s in segs {
        let lo = a.max(base);
        let hi = b.min(base + s.len());
        if lo < hi {
            scratch[lo - a..hi - a].copy_from_slice(&s[lo - base..hi - base]);
        }
        base += s.len();
    }
    &scratch[..b - a]
}

/// Cuts a replica to `len` bytes: fixes the CRC of a new partial last chunk
/// (after checking the old one, so truncation never blesses corrupt bytes),
/// then shrinks the data and the meta file. Returns the bytes of the partial
/// last chunk. Both files must be open for reading and writing.
pub(crate) fn shrink(
    block: u64,
    data: &File,
    data_path: &Path,
    meta: &File,
    meta_path: &Path,
    len: u64,
) -> Result<Vec<u8>, StorageError> {
    let data_len = file_len(data, data_path)?;
    if data_len < len {
        return Err(StorageError::TooShort {
            block,
            replica: data_path.to_path_buf(),
            len: data_len,
            wanted: len,
        });
    }
    let meta_len = file_len(meta, meta_path)?;
    let target = meta_len_for(len);
    if meta_len < target {
        return Err(StorageError::BadMeta {
            path: meta_path.to_path_buf(),
            reason: format!("{meta_len} bytes of checksums, {len} bytes of data need {target}"),
        });
    }
    let part = (len % CS) as usize;
    let mut tail = Vec::new();
    if part != 0 {
        let cs = len - part as u64;
        let chunk_end = (cs + CS).min(data_len);
        let mut chunk = [0u8; CHUNK_SIZE];
        let n = read_full_at(data, &mut chunk[..(chunk_end - cs) as usize], cs)
            .map_err(|e| StorageError::io(data_path, e))?;
        let mut c = [0u8; 4];
        let at = crc_offset(cs / CS);
        meta.read_exact_at(&mut c, at)
            .map_err(|e| StorageError::io(meta_path, e))?;
        let stored = u32::from_be_bytes(c);
        if longest_matching_prefix(&chunk[..n], part, stored).is_none() {
            return Err(StorageError::Corrupt {
                block,
                replica: data_path.to_path_buf(),
                offset: cs,
            });
        }
        let fixed = crc(&chunk[..part]);
        if fixed != stored {
            // Before cutting the data: a crash in between leaves a CRC
            // that still matches a prefix of the longer data.
            meta.write_all_at(&fixed.to_be_bytes(), at)
                .map_err(|e| StorageError::io(meta_path, e))?;
        }
        tail.extend_from_slice(&chunk[..part]);
    }
    if data_len > len {
        data.set_len(len)
            .map_err(|e| StorageError::io(data_path, e))?;
    }
    if meta_len > target {
        meta.set_len(target)
            .map_err(|e| StorageError::io(meta_path, e))?;
    }
    Ok(tail)
}

pub(crate) fn file_len(f: &File, path: &Path) -> Result<u64, StorageError> {
    f.metadata()
        .map(|m| m.len())
        .map_err(|e| StorageError::io(path, e))
}

/// `fsync` of a directory, making entries created, renamed or removed in it
/// durable.
pub(crate) fn fsync_dir(dir: &Path) -> Result<(), StorageError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| StorageError::io(dir, e))
}

/// `pread` until `buf` is full or end of file; returns the bytes read.
pub(crate) fn read_full_at(f: &File, buf: &mut [u8], mut offset: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match f.read_at(&mut buf[done..], offset) {
            Ok(0) => break,
            Ok(n) => {
                done += n;
                offset += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// `preadv` until every buffer is full or end of file; returns the bytes
/// read. One system call in the usual case.
fn preadv_full(f: &File, bufs: &mut [IoSliceMut<'_>], mut offset: u64) -> io::Result<usize> {
    let mut bufs = bufs;
    IoSliceMut::advance_slices(&mut bufs, 0);
    let mut done = 0;
    while !bufs.is_empty() {
        let off = libc::off_t::try_from(offset)
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: `IoSliceMut` is ABI-compatible with `iovec` on Unix, and
        // every slice is a live, exclusively borrowed buffer; the count is
        // at most 3 here (far below IOV_MAX).
        let n = unsafe {
            libc::preadv(
                f.as_raw_fd(),
                bufs.as_ptr().cast::<libc::iovec>(),
                bufs.len() as libc::c_int,
                off,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            break;
        }
        let n = n as usize;
        done += n;
        offset += n as u64;
        IoSliceMut::advance_slices(&mut bufs, n);
    }
    Ok(done)
}
