//! Known content: every byte a workload writes is a function of the file's
//! name and the byte's offset, so a checker can tell a lost, shifted,
//! zeroed or foreign byte anywhere in a file without keeping a copy.

/// A small deterministic generator (xorshift), for choices that a seed
/// replays.
#[derive(Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }
    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi.saturating_sub(lo) + 1)
    }
    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
}

fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// The byte at offset `k` of file `name`.
pub fn byte_at(seed: u64, k: u64) -> u8 {
    let x = (k / 8).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seed;
    let x = x ^ (x >> 29);
    let x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    (x >> (8 * (k % 8))) as u8
}

/// The content seed of a file name.
pub fn seed_of(name: &str) -> u64 {
    fnv(name)
}

/// Bytes `off..off+len` of file `name`.
pub fn bytes(name: &str, off: u64, len: u64) -> Vec<u8> {
    let s = seed_of(name);
    (off..off + len).map(|k| byte_at(s, k)).collect()
}

/// The first offset at which `got` differs from file `name`'s content, if
/// any.
pub fn first_mismatch(name: &str, got: &[u8]) -> Option<u64> {
    let s = seed_of(name);
    got.iter()
        .enumerate()
        .find(|&(k, b)| *b != byte_at(s, k as u64))
        .map(|(k, _)| k as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_depends_on_name_and_offset() {
        let a = bytes("a", 0, 4096);
        assert_eq!(first_mismatch("a", &a), None);
        assert_eq!(bytes("a", 100, 50), a[100..150].to_vec());
        assert!(first_mismatch("b", &a).is_some());
        let mut z = a.clone();
        z[3000] ^= 1;
        assert_eq!(first_mismatch("a", &z), Some(3000));
    }
}
