//! CRC32C checksums of 512-byte chunks, the header of a replica's `.meta`
//! file, and [`ChunkAccumulator`], which gives the write pipeline the CRCs of
//! each packet when a packet starts in the middle of a chunk.
//!
//! Meta file layout (HDFS-like): an 8-byte header (`b"LFS1"`, u16 BE version
//! 1, u8 checksum type 2 = CRC32C, u8 log2(bytes per checksum) = 9), then one
//! u32 BE CRC32C per 512-byte chunk of the data file. The last chunk may be
//! partial: its CRC covers only the bytes present.

use std::path::Path;

use super::error::StorageError;

/// Bytes covered by one checksum.
pub const CHUNK_SIZE: usize = 512;
/// Length of the header at the start of every `.meta` file.
pub const META_HEADER_LEN: u64 = 8;
/// Bytes per stored checksum.
pub const CRC_LEN: u64 = 4;

const MAGIC: &[u8; 4] = b"LFS1";
const VERSION: u16 = 1;
const TYPE_CRC32C: u8 = 2;
const LOG2_CHUNK: u8 = 9;
const _: () = assert!(1 << LOG2_CHUNK == CHUNK_SIZE);

/// CRC32C (Castagnoli) of `data`, hardware-accelerated where available.
pub fn crc(data: &[u8]) -> u32 {
    crc32c::crc32c(data)
}

/// The CRCs of three whole chunks at once. The `crc32` instruction has a
/// latency of three cycles and a throughput of one, so one chunk at a time
/// (what [`crc`] does for 512 bytes) leaves two thirds of the unit idle:
/// interleaving three independent chunks verifies a MiB about 2.5x faster
/// (the daemon spent an eighth of a served read in [`crc`]; benches/PROFILE.md,
/// "Reads, issue 28"). Same values as [`crc`] of each chunk.
pub fn crc3(a: &[u8; CHUNK_SIZE], b: &[u8; CHUNK_SIZE], c: &[u8; CHUNK_SIZE]) -> [u32; 3] {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("sse4.2") {
            // SAFETY: the CPU has SSE 4.2 (checked just above).
            return unsafe { crc3_sse42(a, b, c) };
        }
    }
    [crc(a), crc(b), crc(c)]
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
fn crc3_sse42(a: &[u8; CHUNK_SIZE], b: &[u8; CHUNK_SIZE], c: &[u8; CHUNK_SIZE]) -> [u32; 3] {
    use std::arch::x86_64::_mm_crc32_u64;
    let word = |s: &[u8; CHUNK_SIZE], i: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&s[i * 8..i * 8 + 8]);
        u64::from_le_bytes(w)
    };
    // CRC32C with the usual pre- and post-inversion, as `crc32c::crc32c`.
    let (mut x, mut y, mut z) = (
        u64::from(u32::MAX),
        u64::from(u32::MAX),
        u64::from(u32::MAX),
    );
    for i in 0..CHUNK_SIZE / 8 {
        x = _mm_crc32_u64(x, word(a, i));
        y = _mm_crc32_u64(y, word(b, i));
        z = _mm_crc32_u64(z, word(c, i));
    }
    [!(x as u32), !(y as u32), !(z as u32)]
}

/// The CRC of `prefix ++ data`, given `prev = crc(prefix)`.
pub fn crc_append(prev: u32, data: &[u8]) -> u32 {
    crc32c::crc32c_append(prev, data)
}

/// Appends to `out` one CRC per 512-byte chunk of `data` (the last chunk may
/// be partial). `out` is not cleared, so callers can reuse one buffer.
pub fn chunk_crcs(data: &[u8], out: &mut Vec<u32>) {
    out.reserve(data.len().div_ceil(CHUNK_SIZE));
    out.extend(data.chunks(CHUNK_SIZE).map(crc));
}

/// Number of chunks (and so of CRCs) that describe `len` bytes of data.
pub fn chunk_count(len: u64) -> u64 {
    len.div_ceil(CHUNK_SIZE as u64)
}

/// Length of a complete `.meta` file for `data_len` bytes of data.
pub fn meta_len_for(data_len: u64) -> u64 {
    META_HEADER_LEN + chunk_count(data_len) * CRC_LEN
}

/// Byte offset in the `.meta` file of the CRC of chunk `chunk`.
pub fn crc_offset(chunk: u64) -> u64 {
    META_HEADER_LEN + chunk * CRC_LEN
}

/// The 8-byte header written at the start of every `.meta` file.
pub fn encode_header() -> [u8; 8] {
    let v = VERSION.to_be_bytes();
    [
        MAGIC[0],
        MAGIC[1],
        MAGIC[2],
        MAGIC[3],
        v[0],
        v[1],
        TYPE_CRC32C,
        LOG2_CHUNK,
    ]
}

/// Checks a `.meta` header; the error names no file (see [`check_header_at`]).
pub fn check_header(h: &[u8]) -> Result<(), StorageError> {
    check_header_at(h, Path::new(""))
}

/// Checks a `.meta` header read from `path`, naming it in the error.
pub fn check_header_at(h: &[u8], path: &Path) -> Result<(), StorageError> {
    let bad = |reason: String| StorageError::BadMeta {
        path: path.to_path_buf(),
        reason,
    };
    if h.len() < META_HEADER_LEN as usize {
        return Err(bad(format!("header is {} bytes, expected 8", h.len())));
    }
    if &h[..4] != MAGIC {
        return Err(bad(format!(
            "bad magic {:02x?}, expected \"LFS1\"",
            &h[..4]
        )));
    }
    let version = u16::from_be_bytes([h[4], h[5]]);
    if version != VERSION {
        return Err(bad(format!("unsupported version {version}")));
    }
    if h[6] != TYPE_CRC32C {
        return Err(bad(format!("checksum type {} is not CRC32C (2)", h[6])));
    }
    if h[7] != LOG2_CHUNK {
        return Err(bad(format!(
            "bytes per checksum 2^{} is not 512 (2^9)",
            h[7]
        )));
    }
    Ok(())
}

/// The longest `k >= min_len` such that `crc(&chunk[..k]) == stored`, if any.
///
/// Used for the last chunk of a replica, whose stored CRC may cover fewer
/// bytes than the data file holds: the writer writes data before checksums,
/// so a reader of a replica being written, or a replica left by a crash
/// between the two writes, can see bytes that no CRC covers yet. Accepting a
/// matching prefix never serves an unverified byte.
pub fn longest_matching_prefix(chunk: &[u8], min_len: usize, stored: u32) -> Option<usize> {
    if min_len > chunk.len() {
        return None;
    }
    let mut c = crc(&chunk[..min_len]);
    let mut best = (c == stored).then_some(min_len);
    for k in min_len..chunk.len() {
        c = crc_append(c, &chunk[k..k + 1]);
        if c == stored {
            best = Some(k + 1);
        }
    }
    best
}

/// Computes each packet's CRCs from a block's byte stream, in order.
///
/// A packet that starts in the middle of a chunk (after a flush sent a
/// partial chunk) must carry the CRC of the *whole* chunk, old bytes and
/// new; the accumulator keeps the trailing partial chunk of what was already
/// sent, and its CRC, to compute it without re-reading anything.
#[derive(Debug, Default, Clone)]
pub struct ChunkAccumulator {
    /// Bytes of the current partial chunk already sent (< 512).
    tail: Vec<u8>,
    /// `crc(&tail)`.
    tail_crc: u32,
}

impl ChunkAccumulator {
    /// An accumulator at the start of a block.
    pub fn new() -> Self {
        Self::default()
    }

    /// An accumulator for a block whose data so far ends with `partial_tail`
    /// (the bytes after the last 512-byte boundary; empty when aligned), as
    /// when appending to an existing block.
    /// Given more than a partial chunk, keeps only what follows the last
    /// 512-byte boundary.
    pub fn resume(mut partial_tail: Vec<u8>) -> Self {
        let keep = partial_tail.len() % CHUNK_SIZE;
        partial_tail.drain(..partial_tail.len() - keep);
        let tail_crc = crc(&partial_tail);
        Self {
            tail: partial_tail,
            tail_crc,
        }
    }

    /// The bytes of the current partial chunk.
    pub fn tail(&self) -> &[u8] {
        &self.tail
    }

    /// Forgets the partial chunk, at a block boundary.
    pub fn reset(&mut self) {
        self.tail.clear();
        self.tail_crc = 0;
    }

    /// Appends to `out` the CRCs of the chunks from `offset / 512` to the end
    /// of `offset + data.len()` (offsets within the block), the first being
    /// the CRC of the whole chunk when `offset` is mid-chunk, then remembers
    /// the new partial tail. `offset % 512` must equal the length of the
    /// remembered tail (the stream is contiguous).
    pub fn crcs_for(&mut self, offset: u64, data: &[u8], out: &mut Vec<u32>) {
        debug_assert_eq!(
            (offset % CHUNK_SIZE as u64) as usize,
            self.tail.len(),
            "packet at {offset} does not continue the stream"
        );
        if data.is_empty() {
            return;
        }
        let mut rest = data;
        if !self.tail.is_empty() {
            let fill = (CHUNK_SIZE - self.tail.len()).min(rest.len());
            let (head, after) = rest.split_at(fill);
            let whole = crc_append(self.tail_crc, head);
            out.push(whole);
            if self.tail.len() + fill < CHUNK_SIZE {
                // Still inside the same partial chunk.
                self.tail.extend_from_slice(head);
                self.tail_crc = whole;
                return;
            }
            rest = after;
        }
        chunk_crcs(rest, out);
        let partial = rest.len() % CHUNK_SIZE;
        self.tail.clear();
        self.tail.extend_from_slice(&rest[rest.len() - partial..]);
        self.tail_crc = match out.last() {
            Some(&c) if partial > 0 => c,
            _ => 0,
        };
    }

    /// [`Self::crcs_for`] of `len` zero bytes, without them: the CRC of a
    /// whole chunk of zeros is one constant, so growing a file by a hole
    /// costs its checksums only (4 bytes per 512), never the zeros.
    pub fn crcs_for_zeros(&mut self, offset: u64, len: u64, out: &mut Vec<u32>) {
        const ZEROS: [u8; CHUNK_SIZE] = [0; CHUNK_SIZE];
        const CS: u64 = CHUNK_SIZE as u64;
        debug_assert_eq!(
            (offset % CS) as usize,
            self.tail.len(),
            "zeros at {offset} do not continue the stream"
        );
        if len == 0 {
            return;
        }
        let mut rest = len;
        if !self.tail.is_empty() {
            let fill = (CHUNK_SIZE - self.tail.len()).min(rest as usize);
            let whole = crc_append(self.tail_crc, &ZEROS[..fill]);
            out.push(whole);
            if self.tail.len() + fill < CHUNK_SIZE {
                self.tail.resize(self.tail.len() + fill, 0);
                self.tail_crc = whole;
                return;
            }
            rest -= fill as u64;
        }
        let whole = usize::try_from(rest / CS).unwrap_or(usize::MAX);
        out.reserve(whole + 1);
        out.extend(std::iter::repeat_n(crc(&ZEROS), whole));
        let partial = (rest % CS) as usize;
        self.tail.clear();
        self.tail_crc = 0;
        if partial > 0 {
            let c = crc(&ZEROS[..partial]);
            out.push(c);
            self.tail.resize(partial, 0);
            self.tail_crc = c;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(n: usize, seed: u8) -> Vec<u8> {
        (0..n)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    /// Zeros given by length get the CRCs the same zeros given as bytes
    /// get, whatever the partial chunk before them and their length.
    #[test]
    fn zeros_by_length_have_the_crcs_of_zero_bytes() {
        for tail in [0usize, 1, 100, 511] {
            for len in [0u64, 1, 10, 411, 412, 512, 513, 1024, 5000, 70_000] {
                let head = bytes(tail, 3);
                let (mut a, mut b) = (
                    ChunkAccumulator::resume(head.clone()),
                    ChunkAccumulator::resume(head),
                );
                let (mut ca, mut cb) = (Vec::new(), Vec::new());
                a.crcs_for(tail as u64, &vec![0u8; len as usize], &mut ca);
                b.crcs_for_zeros(tail as u64, len, &mut cb);
                assert_eq!(ca, cb, "tail {tail}, len {len}");
                // And the stream goes on alike.
                let next = tail as u64 + len;
                let more = bytes(700, 9);
                ca.clear();
                cb.clear();
                a.crcs_for(next, &more, &mut ca);
                b.crcs_for(next, &more, &mut cb);
                assert_eq!(ca, cb, "after tail {tail}, len {len}");
            }
        }
    }

    #[test]
    fn crc_is_crc32c() {
        // The standard CRC32C check value.
        assert_eq!(crc(b"123456789"), 0xE306_9283);
        assert_eq!(crc_append(crc(b"1234"), b"56789"), crc(b"123456789"));
    }

    #[test]
    fn chunk_crcs_last_chunk_partial() {
        let data = bytes(1300, 7);
        let mut out = vec![42];
        chunk_crcs(&data, &mut out);
        assert_eq!(
            out,
            vec![
                42,
                crc(&data[..512]),
                crc(&data[512..1024]),
                crc(&data[1024..])
            ]
        );
        assert_eq!(meta_len_for(1300), 8 + 3 * 4);
        assert_eq!(meta_len_for(1024), 8 + 2 * 4);
        assert_eq!(meta_len_for(0), 8);
    }

    #[test]
    fn header_round_trips_and_rejects_garbage() {
        let h = encode_header();
        assert_eq!(&h, b"LFS1\x00\x01\x02\x09");
        check_header(&h).unwrap();
        for (i, v) in [(0, b'X'), (5, 2), (6, 1), (7, 10)] {
            let mut bad = h;
            bad[i] = v;
            assert!(matches!(
                check_header(&bad),
                Err(StorageError::BadMeta { .. })
            ));
        }
        assert!(check_header(&h[..7]).is_err());
    }

    #[test]
    fn longest_matching_prefix_finds_covered_length() {
        let data = bytes(400, 3);
        assert_eq!(
            longest_matching_prefix(&data, 10, crc(&data[..300])),
            Some(300)
        );
        assert_eq!(longest_matching_prefix(&data, 301, crc(&data[..300])), None);
        assert_eq!(longest_matching_prefix(&data, 0, crc(&data)), Some(400));
        assert_eq!(longest_matching_prefix(&data, 0, crc(b"")), Some(0));
    }

    /// Feeds `stream` in packets of the given sizes and checks that writing
    /// each packet's CRCs at `offset / 512` yields `chunk_crcs(stream)`.
    fn check_split(stream: &[u8], sizes: &[usize]) {
        let mut acc = ChunkAccumulator::new();
        let mut meta: Vec<u32> = Vec::new();
        let mut off = 0usize;
        for &n in sizes {
            let n = n.min(stream.len() - off);
            let mut out = Vec::new();
            acc.crcs_for(off as u64, &stream[off..off + n], &mut out);
            let first = off / CHUNK_SIZE;
            let expect = if n == 0 {
                0
            } else {
                (off + n).div_ceil(CHUNK_SIZE) - first
            };
            assert_eq!(out.len(), expect, "packet at {off} len {n}");
            if n > 0 {
                meta.truncate(first);
                meta.extend_from_slice(&out);
            }
            off += n;
            assert_eq!(acc.tail(), &stream[off - off % CHUNK_SIZE..off]);
        }
        let mut want = Vec::new();
        chunk_crcs(&stream[..off], &mut want);
        assert_eq!(
            meta,
            want,
            "{} packets, first {:?}",
            sizes.len(),
            sizes.first()
        );
    }

    #[test]
    fn chunk_accumulator_matches_chunk_crcs_of_concatenation() {
        let stream = bytes(5000, 11);
        check_split(&stream, &[5000]);
        check_split(&stream, &[100, 100, 100, 300, 1, 511, 512, 1024, 2000]);
        check_split(&stream, &[512, 0, 512, 700, 324, 1, 1, 1]);
        check_split(&stream, &[3, 509, 513, 1535, 2000]);
        for step in [1, 7, 200, 511, 513, 4096] {
            check_split(&stream, &vec![step; 5000 / step + 1]);
        }
    }

    #[test]
    fn chunk_accumulator_resume_and_reset() {
        let stream = bytes(2000, 5);
        // Resume after 700 bytes were written elsewhere.
        let mut acc = ChunkAccumulator::resume(stream[512..700].to_vec());
        let mut out = Vec::new();
        acc.crcs_for(700, &stream[700..2000], &mut out);
        let mut want = Vec::new();
        chunk_crcs(&stream, &mut want);
        assert_eq!(out, want[1..]);
        acc.reset();
        out.clear();
        acc.crcs_for(0, &stream[..10], &mut out);
        assert_eq!(out, vec![crc(&stream[..10])]);
    }
}

#[cfg(test)]
mod crc3_tests {
    use super::{CHUNK_SIZE, crc, crc3};

    #[test]
    fn crc3_matches_crc_of_each_chunk() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut chunk = || {
            let mut c = [0u8; CHUNK_SIZE];
            for b in c.iter_mut() {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                *b = seed as u8;
            }
            c
        };
        for _ in 0..50 {
            let (a, b, c) = (chunk(), chunk(), chunk());
            assert_eq!(crc3(&a, &b, &c), [crc(&a), crc(&b), crc(&c)]);
        }
        let z = [0u8; CHUNK_SIZE];
        assert_eq!(crc3(&z, &z, &z), [crc(&z); 3]);
    }
}
