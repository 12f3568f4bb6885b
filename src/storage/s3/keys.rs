//! The layout of an object-store datanode in its bucket, as key names only
//! (no requests), and what one listing of a block's keys says about its
//! replica. The layout and its costs are in docs/SEMANTICS.md,
//! "Object-store datanodes".
//!
//! ```text
//! P/VERSION                              identity (as a directory's VERSION file)
//! P/probe/<storage id>                   heartbeat probe
//! P/blk/<id>/<gs:020>/gen                the replica exists at this stamp (being written)
//! P/blk/<id>/<gs:020>/final              ... and is finalized
//! P/blk/<id>/<gs:020>/s<seq:010>-<start:020>-<end:020>   an immutable slice
//! P/quarantine/<unix secs>-blk_<id>/...  what quarantine moved there
//! ```
//!
//! A replica is the highest stamp with a `gen` or `final` object. Its bytes
//! are its slices applied in `seq` order, each cutting what came before at
//! its `start` and appending its bytes: a slice always starts on a chunk
//! boundary and carries the CRC of every chunk it holds, so each chunk's
//! bytes and CRC come from one immutable object. A cut (truncation,
//! recovery) is one more slice: the partial chunk before the cut point
//! rewritten, or an empty slice at a chunk boundary.

use std::collections::BTreeMap;

use super::super::checksum::CHUNK_SIZE;
use super::bucket::Listed;

/// Under the prefix: the identity object.
pub const VERSION: &str = "VERSION";
/// Under the prefix: replicas.
pub const BLK: &str = "blk";
/// Under the prefix: quarantined objects.
pub const QUARANTINE: &str = "quarantine";
/// Under the prefix: heartbeat probes.
pub const PROBE: &str = "probe";

/// Marker object names inside a generation.
pub const GEN: &str = "gen";
pub const FINAL: &str = "final";

/// Every object of `block`: `blk/<id>`.
pub fn block_dir(block: u64) -> String {
    format!("{BLK}/{block}")
}

/// Every object of `block`@`gs`.
pub fn gen_dir(block: u64, gs: u64) -> String {
    format!("{BLK}/{block}/{gs:020}")
}

pub fn marker(block: u64, gs: u64, name: &str) -> String {
    format!("{}/{name}", gen_dir(block, gs))
}

pub fn slice_key(block: u64, gs: u64, s: &SliceName) -> String {
    format!(
        "{}/s{:010}-{:020}-{:020}",
        gen_dir(block, gs),
        s.seq,
        s.start,
        s.end
    )
}

/// A slice as its key names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SliceName {
    pub seq: u64,
    pub start: u64,
    pub end: u64,
}

/// The slice object: magic, then one CRC32C (big-endian) per chunk of
/// `[start, end)`, then the bytes.
pub const SLICE_MAGIC: &[u8; 8] = b"LFSSLC01";

impl SliceName {
    pub fn chunks(&self) -> u64 {
        (self.end - self.start).div_ceil(CHUNK_SIZE as u64)
    }
    /// Where the bytes start in the object.
    pub fn data_at(&self) -> u64 {
        SLICE_MAGIC.len() as u64 + 4 * self.chunks()
    }
    pub fn object_len(&self) -> u64 {
        self.data_at() + (self.end - self.start)
    }
}

fn parse_slice(name: &str) -> Option<SliceName> {
    let mut it = name.strip_prefix('s')?.split('-');
    let seq = it.next()?.parse().ok()?;
    let start = it.next()?.parse().ok()?;
    let end = it.next()?.parse().ok()?;
    (it.next().is_none() && start <= end && start % CHUNK_SIZE as u64 == 0).then_some(SliceName {
        seq,
        start,
        end,
    })
}

/// The objects of one generation of a block.
#[derive(Debug, Default, Clone)]
pub struct Gen {
    pub open: bool,
    pub fin: bool,
    /// Slices by seq, with the object's listed size.
    pub slices: BTreeMap<u64, (SliceName, u64)>,
}

impl Gen {
    /// The replica's state, as its markers say.
    pub fn state(&self) -> crate::storage::ReplicaState {
        if self.fin {
            crate::storage::ReplicaState::Finalized
        } else {
            crate::storage::ReplicaState::Rbw
        }
    }

    /// The generation exists (a marker object says so).
    pub fn exists(&self) -> bool {
        self.open || self.fin
    }
}

/// One stretch of a replica's bytes and the slice holding it.
#[derive(Debug, Clone, Copy)]
pub struct Extent {
    pub slice: SliceName,
    /// Replica bytes `[slice.start, end)` come from this slice.
    pub end: u64,
    /// The object's size as listed.
    pub size: u64,
}

/// A replica's bytes: where each stretch is. Each slice, in seq order,
/// replaces the replica from its start on. `Err(at)`: the bytes that
/// result have a gap at `at` (a slice starts past the end of what came
/// before it, and no later slice covers that: a writer never leaves one,
/// so the replica is damaged there). A gap a later slice covers is no
/// damage: it is what a half-done prune leaves (a merged slice from 0,
/// and some of the small slices it replaced, the first ones deleted), and
/// what a store whose listing still shows some deleted slices lists.
pub fn resolve(g: &Gen) -> Result<Vec<Extent>, u64> {
    let mut ext: Vec<Extent> = Vec::new();
    for (s, size) in g.slices.values() {
        while ext.last().is_some_and(|e| e.slice.start >= s.start) {
            ext.pop();
        }
        if let Some(e) = ext.last_mut() {
            e.end = e.end.min(s.start);
        }
        // An empty slice (a cut) stays until the check below: a cut
        // past the end is a gap too.
        ext.push(Extent {
            slice: *s,
            end: s.end,
            size: *size,
        });
    }
    // Every stretch starts where the one before it ends, the first at 0.
    let mut at = 0;
    for e in &ext {
        if e.slice.start != at {
            return Err(at);
        }
        at = e.end;
    }
    ext.retain(|e| e.end > e.slice.start);
    Ok(ext)
}

/// The length of the bytes `ext` describes.
pub fn len_of(ext: &[Extent]) -> u64 {
    ext.last().map_or(0, |e| e.end)
}

/// A block's objects, by generation stamp, from a listing of `blk/<id>/`.
#[derive(Debug, Default)]
pub struct BlockObjects {
    pub gens: BTreeMap<u64, Gen>,
    /// Every key listed (relative to the prefix), for deletion and copies.
    pub keys: Vec<String>,
}

impl BlockObjects {
    pub fn from_listing(block: u64, listed: &[Listed]) -> BlockObjects {
        let dir = format!("{}/", block_dir(block));
        let mut b = BlockObjects::default();
        for l in listed {
            let Some(rest) = l.rel.strip_prefix(&dir) else {
                continue;
            };
            b.keys.push(l.rel.clone());
            let Some((gs, name)) = rest.split_once('/') else {
                continue;
            };
            let Ok(gs) = gs.parse::<u64>() else { continue };
            let g = b.gens.entry(gs).or_default();
            match name {
                GEN => g.open = true,
                FINAL => g.fin = true,
                n => {
                    if let Some(s) = parse_slice(n) {
                        g.slices.insert(s.seq, (s, l.size));
                    }
                }
            }
        }
        b
    }

    /// The replica: the highest stamp that exists.
    pub fn current(&self) -> Option<(u64, &Gen)> {
        self.gens
            .iter()
            .rev()
            .find(|(_, g)| g.exists())
            .map(|(gs, g)| (*gs, g))
    }

    /// Keys of generation `gs`.
    pub fn keys_of(&self, block: u64, gs: u64) -> impl Iterator<Item = &String> {
        let dir = format!("{}/", gen_dir(block, gs));
        self.keys.iter().filter(move |k| k.starts_with(&dir))
    }
}

/// Block ids and keys grouped from a listing of `blk/`.
pub fn group_by_block(listed: Vec<Listed>) -> BTreeMap<u64, Vec<Listed>> {
    let mut m: BTreeMap<u64, Vec<Listed>> = BTreeMap::new();
    for l in listed {
        let id = l
            .rel
            .strip_prefix(BLK)
            .and_then(|r| r.strip_prefix('/'))
            .and_then(|r| r.split('/').next())
            .and_then(|b| b.parse::<u64>().ok());
        if let Some(id) = id {
            m.entry(id).or_default().push(l);
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gen_of(slices: &[(u64, u64, u64)]) -> Gen {
        let mut g = Gen {
            open: true,
            ..Gen::default()
        };
        for &(seq, start, end) in slices {
            let s = SliceName { seq, start, end };
            g.slices.insert(seq, (s, s.object_len()));
        }
        g
    }

    #[test]
    fn later_slices_cut_at_their_start() {
        // Appends that rewrite the partial chunk, then a cut at 600.
        let g = gen_of(&[(0, 0, 700), (1, 512, 2000), (2, 1536, 1600), (3, 512, 600)]);
        let e = resolve(&g).unwrap();
        assert_eq!(len_of(&e), 600);
        assert_eq!(e.len(), 2);
        assert_eq!((e[0].slice.seq, e[0].end), (0, 512));
        assert_eq!((e[1].slice.seq, e[1].end), (3, 600));
        // An empty slice cuts at a boundary.
        let g = gen_of(&[(0, 0, 4096), (1, 1024, 1024)]);
        assert_eq!(len_of(&resolve(&g).unwrap()), 1024);
        // A gap is damage.
        let g = gen_of(&[(0, 0, 512), (1, 1024, 2048)]);
        assert_eq!(resolve(&g).unwrap_err(), 512);
        let g = gen_of(&[(1, 1024, 2048)]);
        assert_eq!(resolve(&g).unwrap_err(), 0);
        // A later slice that starts at or before the gap covers it.
        let g = gen_of(&[(0, 0, 512), (1, 1024, 2048), (2, 256, 4096)]);
        let e = resolve(&g).unwrap();
        assert_eq!(len_of(&e), 4096);
        assert_eq!((e[0].slice.seq, e[0].end), (0, 256));
        assert_eq!((e[1].slice.seq, e[1].end), (2, 4096));
        // An empty slice past a gap cuts nothing into existence.
        let g = gen_of(&[(0, 0, 512), (1, 1024, 1024)]);
        assert_eq!(resolve(&g).unwrap_err(), 512);
    }

    #[test]
    fn a_half_done_prune_of_merged_slices_leaves_a_whole_replica() {
        // Finalize merged slices 0..4 into slice 4, and the prune that
        // deletes the small ones in order stopped (or the store's listing
        // still shows some of them) after the first two.
        let g = gen_of(&[(2, 128, 192), (3, 192, 256), (4, 0, 256)]);
        let e = resolve(&g).unwrap();
        assert_eq!(len_of(&e), 256);
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].slice.seq, 4);
    }

    #[test]
    fn listing_finds_the_highest_existing_stamp() {
        let l = |rel: &str| Listed {
            rel: rel.into(),
            size: 8,
            modified: None,
        };
        let s = SliceName {
            seq: 0,
            start: 0,
            end: 0,
        };
        let listed = vec![
            l(&marker(7, 3, GEN)),
            l(&slice_key(7, 3, &s)),
            // A stamp whose copy was interrupted: no marker, not a replica.
            l(&slice_key(7, 9, &s)),
            l(&marker(7, 1, FINAL)),
        ];
        let b = BlockObjects::from_listing(7, &listed);
        let (gs, g) = b.current().unwrap();
        assert_eq!(gs, 3);
        assert!(g.open && !g.fin && g.slices.len() == 1);
        assert_eq!(b.keys_of(7, 9).count(), 1);
        assert_eq!(
            parse_slice("s0000000001-00000000000000000512-00000000000000000600"),
            Some(SliceName {
                seq: 1,
                start: 512,
                end: 600
            })
        );
        assert_eq!(parse_slice("s1-100-600"), None);
    }
}
