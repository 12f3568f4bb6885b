//! [`ReplicaReader`]: checksum-verified reads of one replica, and its valid
//! prefix (what lease recovery and fsck trust of it).
//!
//! Ordering contract with [`super::writer`]: the writer writes a packet's
//! data before its checksums, and the reader reads checksums before data.
//! A reader that sees a checksum therefore also sees the bytes it covers;
//! it may see bytes that no checksum covers yet, which it never serves
//! (see [`longest_matching_prefix`]).

use std::fs::File;
use std::io::IoSliceMut;
use std::path::Path;

use super::at::At;
use super::checksum::{
    CHUNK_SIZE, CRC_LEN, META_HEADER_LEN, check_header_at, chunk_count, crc, crc_offset, crc3,
    longest_matching_prefix,
};
use super::error::StorageError;
use super::fsops::{Wait, file_len, preadv_full_as, read_full_at, read_full_at_as};
use super::layout::{Layout, Located, ReplicaState, data_name, meta_name};
use super::locate::{Opened, missing_or_stale, open_first};
use super::note::Note;
use super::s3::reader::ObjectReader;
use crate::metrics::{Fast, IoCounters};
use crate::sync::Arc;

const CS: u64 = CHUNK_SIZE as u64;

/// Reads of at least this much start reading ahead (see
/// [`ReplicaReader::read_ahead`]): sequential readers read in large
/// requests.
const READ_AHEAD_FROM: usize = 128 << 10;

/// Opens replica `block`@`gs` of the datanode laid out as `l` for verified
/// reads, counting them in `io`.
pub(crate) fn open(
    l: &Layout,
    io: &Arc<IoCounters>,
    block: u64,
    gs: u64,
) -> Result<ReplicaReader, StorageError> {
    open_files(l, io, block, gs).map(ReplicaReader::from)
}

fn open_files(
    l: &Layout,
    io: &Arc<IoCounters>,
    block: u64,
    gs: u64,
) -> Result<FileReader, StorageError> {
    // Two tries: a concurrent finalize or reopen may move the files
    // between the lookups of one try.
    for _ in 0..2 {
        let meta = open_first(l, &meta_name(block, gs))?;
        let data = open_first(l, &data_name(block))?;
        if let (Some(meta), Some(data)) = (meta, data) {
            let Opened {
                file: meta,
                at: meta_at,
                dir: meta_in,
            } = meta;
            let Opened {
                file: data,
                at: data_at,
                dir: data_in,
            } = data;
            return Ok(FileReader {
                block,
                gs,
                state: Located { data_in, meta_in }.state(),
                data,
                meta,
                data_at,
                meta_at,
                note: l.note(block),
                io: io.clone(),
                direct: std::sync::OnceLock::new(),
            });
        }
    }
    Err(missing_or_stale(l, block, gs))
}

/// Checksum-verified reads of one replica with a known generation stamp,
/// whatever kind of datanode holds it.
#[derive(Debug)]
pub struct ReplicaReader(Backend);

#[derive(Debug)]
enum Backend {
    File(FileReader),
    Object(ObjectReader),
}

impl From<FileReader> for ReplicaReader {
    fn from(r: FileReader) -> Self {
        ReplicaReader(Backend::File(r))
    }
}

impl From<ObjectReader> for ReplicaReader {
    fn from(r: ObjectReader) -> Self {
        ReplicaReader(Backend::Object(r))
    }
}

impl ReplicaReader {
    /// The block this replica belongs to.
    pub fn block(&self) -> u64 {
        match &self.0 {
            Backend::File(r) => r.block(),
            Backend::Object(r) => r.block(),
        }
    }

    /// The generation stamp the reader was opened with.
    pub fn gs(&self) -> u64 {
        match &self.0 {
            Backend::File(r) => r.gs(),
            Backend::Object(r) => r.gs(),
        }
    }

    /// Where the replica was when opened.
    pub fn state(&self) -> ReplicaState {
        match &self.0 {
            Backend::File(r) => r.state(),
            Backend::Object(r) => r.state(),
        }
    }

    /// Where its data is (a file, or the replica's objects), for errors.
    pub fn data_path(&self) -> &Path {
        match &self.0 {
            Backend::File(r) => r.data_path(),
            Backend::Object(r) => r.path(),
        }
    }

    /// Where its checksums are.
    pub fn meta_path(&self) -> &Path {
        match &self.0 {
            Backend::File(r) => r.meta_path(),
            Backend::Object(r) => r.path(),
        }
    }

    /// Current length of its data.
    pub fn data_len(&self) -> Result<u64, StorageError> {
        match &self.0 {
            Backend::File(r) => r.data_len(),
            Backend::Object(r) => Ok(r.len()),
        }
    }

    /// See [`FileReader::present_len`]; an object replica holds no zeros
    /// ahead of its data.
    pub fn present_len(&self) -> Result<u64, StorageError> {
        match &self.0 {
            Backend::File(r) => r.present_len(),
            Backend::Object(r) => Ok(r.len()),
        }
    }

    /// Reads up to `buf.len()` bytes at `offset`, every chunk touched
    /// verified (see [`FileReader::read`], [`ObjectReader::read`]).
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<usize, StorageError> {
        match &self.0 {
            Backend::File(r) => r.read(offset, buf),
            Backend::Object(r) => r.read(offset, buf),
        }
    }

    /// A read through a reader kept open from an earlier read (see
    /// [`FileReader::read_kept`]). An object replica's slices are
    /// immutable; one removed since (a restamp) fails the read, and the
    /// caller reads afresh.
    pub fn read_kept(&self, offset: u64, buf: &mut [u8]) -> Result<usize, StorageError> {
        match &self.0 {
            Backend::File(r) => r.read_kept(offset, buf, Wait::Yes),
            Backend::Object(r) => r.read(offset, buf),
        }
    }

    /// [`ReplicaReader::read_kept`] of bytes the page cache holds, without
    /// waiting for a disk: `Ok(None)` where it would wait (an object
    /// replica always would: its bytes are a network request away).
    pub fn read_cached(&self, offset: u64, buf: &mut [u8]) -> Result<Option<usize>, StorageError> {
        match &self.0 {
            Backend::File(r) => match r.read_kept(offset, buf, Wait::No) {
                Err(StorageError::WouldBlock) => Ok(None),
                r => r.map(Some),
            },
            Backend::Object(_) => Ok(None),
        }
    }

    /// The longest prefix whose chunks match their CRCs.
    pub fn valid_prefix(&self) -> Result<u64, StorageError> {
        match &self.0 {
            Backend::File(r) => r.valid_prefix(),
            Backend::Object(r) => r.valid_prefix(),
        }
    }

    /// The replica's sync note, if it has a whole one (object replicas
    /// have none: their slices are never rewritten in place).
    pub(crate) fn note(&self) -> Option<Note> {
        match &self.0 {
            Backend::File(r) => r.note(),
            Backend::Object(_) => None,
        }
    }
}

/// Open data and meta files of one replica with a known generation stamp,
/// for checksum-verified reads. Cheap to keep open across reads: finalizing
/// renames the files but not the inodes behind these descriptors.
#[derive(Debug)]
pub struct FileReader {
    block: u64,
    gs: u64,
    state: ReplicaState,
    data: File,
    meta: File,
    /// Where the files were opened (`exists` tells whether they are still
    /// there; the paths name them in errors).
    data_at: At,
    meta_at: At,
    /// Its sync note (read only where a chunk fails its checksum).
    note: At,
    /// Its datanode's counters.
    io: Arc<IoCounters>,
    /// The data file opened `O_DIRECT` (see `super::direct`), once a read
    /// that waits for the disk needed it; `None` inside where refused.
    direct: std::sync::OnceLock<Option<File>>,
}

impl FileReader {
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
        &self.data_at.path
    }

    /// The meta file's path when opened.
    pub fn meta_path(&self) -> &Path {
        &self.meta_at.path
    }

    /// Current length of the data file.
    pub fn data_len(&self) -> Result<u64, StorageError> {
        file_len(&self.data, &self.data_at.path)
    }

    /// How many bytes the replica holds with a checksum each could cover:
    /// the data, cut to what the checksum file has room for, less the
    /// zeros a writer that synced often filled its files with ahead of
    /// itself (chunks of zeros whose checksum slot is zero too: a written
    /// chunk of zeros has a checksum that is not).
    pub fn present_len(&self) -> Result<u64, StorageError> {
        let meta_len = file_len(&self.meta, &self.meta_at.path)?;
        let ncrc = meta_len.saturating_sub(META_HEADER_LEN) / CRC_LEN;
        let mut end = chunk_count(self.data_len()?.min(ncrc * CS));
        const BATCH: u64 = 256;
        let mut data = vec![0u8; (BATCH * CS) as usize];
        let mut slots = vec![0u8; (BATCH * CRC_LEN) as usize];
        while end > 0 {
            let n = BATCH.min(end);
            let first = end - n;
            let mgot = read_full_at(
                &self.meta,
                &mut slots[..(n * CRC_LEN) as usize],
                crc_offset(first),
            )
            .map_err(|e| StorageError::io(&self.meta_at.path, e))?;
            let dgot = read_full_at(&self.data, &mut data[..(n * CS) as usize], first * CS)
                .map_err(|e| StorageError::io(&self.data_at.path, e))?;
            for j in (0..n as usize).rev() {
                let slot = slots.get(j * 4..j * 4 + 4).filter(|_| j * 4 + 4 <= mgot);
                let chunk = &data[(j * CHUNK_SIZE).min(dgot)..((j + 1) * CHUNK_SIZE).min(dgot)];
                let zero = slot.is_some_and(|c| c == [0; 4]) && chunk.iter().all(|&b| b == 0);
                if !zero {
                    return Ok(self.data_len()?.min((first + j as u64 + 1) * CS));
                }
            }
            end = first;
        }
        Ok(0)
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
        let r = self.read_verified(offset, buf, Wait::Yes);
        if let Ok(n) = r
            && n >= READ_AHEAD_FROM
            && !self.reads_direct()
        {
            self.read_ahead(offset + n as u64, 2 * n as u64);
        }
        match &r {
            Ok(n) => self.io.read(*n as u64),
            // The last chunk of a replica being written may be read between
            // its data and its checksum: readers retry, it is no failure.
            Err(StorageError::Corrupt { .. }) if self.state == ReplicaState::Rbw => {}
            Err(_) => self.io.error(),
        }
        r
    }

    /// [`ReplicaReader::read`] through a reader kept open from an earlier
    /// read: the same verification, counted as a reuse, and no explicit
    /// read-ahead (the kernel's own follows this descriptor). With
    /// `Wait::No`, [`StorageError::WouldBlock`] where a byte it needs (data
    /// or checksum) is not in the page cache.
    pub(crate) fn read_kept(
        &self,
        offset: u64,
        buf: &mut [u8],
        wait: Wait,
    ) -> Result<usize, StorageError> {
        let r = self.read_verified(offset, buf, wait);
        // A failure is not counted here: the caller drops this reader and
        // reads the replica afresh, which counts it.
        if let Ok(n) = &r {
            self.io.read(*n as u64);
            self.io.fast(Fast::ReaderReused);
            if wait == Wait::No {
                self.io.fast(Fast::ReadInMemory);
            }
        }
        r
    }

    /// Asks the kernel to start reading `len` bytes at `offset` (and their
    /// checksums) into the page cache. A reader is opened for each request,
    /// so the kernel's own readahead, which follows one open file, never
    /// sees a sequential reader: without this each request of a sequential
    /// read waits for the disk with nothing read ahead.
    fn read_ahead(&self, offset: u64, len: u64) {
        let advise = |f: &File, off: u64, len: u64| {
            let _ = nix::fcntl::posix_fadvise(
                f,
                off as i64,
                len as i64,
                nix::fcntl::PosixFadviseAdvice::POSIX_FADV_WILLNEED,
            );
        };
        advise(&self.data, offset, len);
        let first = offset / CS;
        advise(&self.meta, crc_offset(first), chunk_count(len) * CRC_LEN);
    }

    fn read_verified(
        &self,
        offset: u64,
        buf: &mut [u8],
        wait: Wait,
    ) -> Result<usize, StorageError> {
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
        let mgot = read_full_at_as(&self.meta, mbuf, meta_at, wait)
            .map_err(|e| StorageError::io(&self.meta_at.path, e))?;
        if hdr > 0 {
            check_header_at(&mbuf[..mgot.min(hdr)], &self.meta_at.path)?;
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
            self.read_data(&mut iov, chunk_start, wait)
                .map_err(|e| StorageError::io(&self.data_at.path, e))?
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
        let stored_at = |i: usize| {
            let c = &crcs[i * 4..i * 4 + 4];
            u32::from_be_bytes([c[0], c[1], c[2], c[3]])
        };
        let (mut i, mut batched) = (0, 0);
        while i < nchunks {
            // Three whole chunks at a time where they match (the common
            // case); a chunk that does not is looked at alone below.
            if (i + 3) * CHUNK_SIZE <= avail
                && let Some(got) = crc3_at(&segs, i)
                && got == [stored_at(i), stored_at(i + 1), stored_at(i + 2)]
            {
                batched += 3;
                i += 3;
                continue;
            }
            let a = i * CHUNK_SIZE;
            let b = (a + CHUNK_SIZE).min(avail);
            let bytes = chunk_bytes(&segs, a, b, &mut scratch);
            let stored = stored_at(i);
            i += 1;
            if crc(bytes) == stored {
                continue;
            }
            // Where a replica being written ends: in its last checksummed
            // chunk, or where the zeros it was filled with ahead begin
            // (their checksum slots are zero too).
            if self.being_written() {
                if let Some(k) = longest_matching_prefix(bytes, 0, stored) {
                    avail = a + k;
                    break;
                }
                if stored == 0 && bytes.iter().all(|&b| b == 0) {
                    avail = a;
                    break;
                }
            }
            self.io.fast_n(Fast::ChunksBatched, batched);
            return Err(self.corrupt(chunk_start + a as u64));
        }
        self.io.fast_n(Fast::ChunksBatched, batched);
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
            .map_err(|e| StorageError::io(&self.meta_at.path, e))?;
        check_header_at(&h[..n], &self.meta_at.path)?;
        let meta_len = file_len(&self.meta, &self.meta_at.path)?;
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
                .map_err(|e| StorageError::io(&self.meta_at.path, e))?;
            let dgot = read_full_at(&self.data, &mut data[..n * CHUNK_SIZE], c * CS)
                .map_err(|e| StorageError::io(&self.data_at.path, e))?;
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
                if !last && crc(bytes) == stored {
                    continue;
                }
                // The last chunk, or the first that does not match: the
                // data may end inside it (followed by more data that no
                // checksum covers yet, or by the zeros a writer filled its
                // files with ahead of itself); or an append's new checksum
                // of it reached the disk and its bytes did not, and the
                // sync note still vouches for what was synced of it.
                let k = longest_matching_prefix(bytes, 0, stored).unwrap_or(0);
                let noted = self
                    .note()
                    .and_then(|n| n.covers(start, bytes))
                    .unwrap_or(0);
                return Ok(start + k.max(noted) as u64);
            }
            if mgot / 4 < n {
                return Ok((c + (mgot / 4) as u64) * CS);
            }
            c += n as u64;
        }
        Ok(c * CS)
    }

    /// Whether reads that wait for the disk bypass the page cache: only a
    /// finalized replica's (one being written is read as its writer
    /// wrote it, through the cache: see the module doc).
    fn reads_direct(&self) -> bool {
        super::direct::enabled() && self.state == ReplicaState::Finalized
    }

    /// The data bytes of whole chunks at `at` into `iov`: with `Wait::No`
    /// only if the page cache holds them (and without starting a read of
    /// them where this reader reads direct: that would cache them under
    /// the replica as well), with `Wait::Yes` straight from the disk
    /// where the reader reads direct and the cache does not hold them.
    fn read_data(&self, iov: &mut [IoSliceMut<'_>], at: u64, wait: Wait) -> std::io::Result<usize> {
        let len: usize = iov.iter().map(|b| b.len()).sum();
        if self.reads_direct() {
            let cached = super::direct::cached(&self.data, at, len as u64);
            match wait {
                Wait::No if cached == Some(false) => {
                    return Err(std::io::ErrorKind::WouldBlock.into());
                }
                Wait::Yes if cached != Some(true) => {
                    let d = self
                        .direct
                        .get_or_init(|| super::direct::reopen(&self.data));
                    if let Some(r) = d
                        .as_ref()
                        .and_then(|d| super::direct::read_into(d, iov, at))
                    {
                        if r.is_ok() {
                            self.io.fast(Fast::ReadDirect);
                        }
                        return r;
                    }
                }
                _ => {}
            }
        }
        preadv_full_as(&self.data, iov, at, wait)
    }

    /// The replica's sync note, if it has a whole one.
    pub(crate) fn note(&self) -> Option<Note> {
        Note::read(&self.note)
    }

    /// Whether the replica may be growing under this reader: it was opened
    /// in `rbw/`, or was finalized but has since been moved back there for
    /// an append (checked only when the data outruns the checksums, so the
    /// common path costs nothing).
    fn being_written(&self) -> bool {
        self.state == ReplicaState::Rbw
            || !(self.data_at.exists().unwrap_or(false) && self.meta_at.exists().unwrap_or(false))
    }

    fn corrupt(&self, offset: u64) -> StorageError {
        StorageError::Corrupt {
            block: self.block,
            replica: self.data_at.path.clone(),
            offset,
        }
    }
}

/// The CRCs of chunks `i..i + 3` of the concatenation of `segs`, when all
/// three are whole and each lies within one segment (all but the chunks at
/// the ends of a read that does not start or end on a chunk boundary).
fn crc3_at(segs: &[&[u8]; 3], i: usize) -> Option<[u32; 3]> {
    let whole = |k: usize| -> Option<&[u8; CHUNK_SIZE]> {
        let (a, mut base) = (k * CHUNK_SIZE, 0);
        for s in segs {
            if a >= base && a + CHUNK_SIZE <= base + s.len() {
                return s[a - base..a - base + CHUNK_SIZE].try_into().ok();
            }
            base += s.len();
        }
        None
    };
    Some(crc3(whole(i)?, whole(i + 1)?, whole(i + 2)?))
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
