//! The replica lifecycle on an object store: create, reopen, restamp, cut,
//! finalize, and the scans they start from. Every method is safe to retry
//! after success, as the [`crate::storage::Storage`] contract asks.

use super::super::checksum::{CHUNK_SIZE, chunk_crcs};
use super::super::error::StorageError;
use super::ObjectDatanode;
use super::keys::{self, BlockObjects, Extent, FINAL, GEN, Gen, SliceName};
use super::reader::ObjectReader;
use super::writer::{ObjectWriter, encode_slice};

const CS: u64 = CHUNK_SIZE as u64;

/// More slices than this in a replica being finalized, smaller than
/// `MERGE_BELOW` on average, are merged into one object (reads of a
/// replica written by small appends would otherwise cost a request per
/// append). Larger slices (a fast writer's merged packets) are left as
/// they are: a read costs a request per megabytes, and merging would move
/// the whole block through the daemon once more.
pub(super) const MERGE_OVER: usize = 16;
const MERGE_BELOW: u64 = 1 << 20;

impl ObjectDatanode {
    /// One listing of the block's objects.
    pub(super) fn scan(&self, block: u64) -> Result<BlockObjects, StorageError> {
        let listed = self.bucket.list(&keys::block_dir(block))?;
        Ok(BlockObjects::from_listing(block, &listed))
    }

    /// The generation `gs` of the block, which must be its replica:
    /// [`StorageError::Missing`] or [`StorageError::StaleGenStamp`] else.
    pub(super) fn current_at(
        &self,
        objs: &BlockObjects,
        block: u64,
        gs: u64,
    ) -> Result<Gen, StorageError> {
        match objs.current() {
            None => Err(StorageError::Missing { block, dn: self.id }),
            Some((found, _)) if found != gs => Err(StorageError::StaleGenStamp {
                block,
                found,
                wanted: gs,
            }),
            Some((_, g)) => Ok(g.clone()),
        }
    }

    pub(super) fn extents(
        &self,
        block: u64,
        gs: u64,
        g: &Gen,
    ) -> Result<Vec<Extent>, StorageError> {
        keys::resolve(g).map_err(|at| StorageError::Corrupt {
            block,
            replica: self.bucket.path_of(&keys::gen_dir(block, gs)),
            offset: at,
        })
    }

    pub(super) fn reader_of(
        &self,
        block: u64,
        gs: u64,
        g: &Gen,
    ) -> Result<ObjectReader, StorageError> {
        Ok(ObjectReader {
            bucket: self.bucket.clone(),
            block,
            gs,
            state: g.state(),
            ext: self.extents(block, gs, g)?,
            io: self.io.clone(),
            path: self.bucket.path_of(&keys::gen_dir(block, gs)),
            ahead: Default::default(),
        })
    }

    fn next_seq(g: &Gen) -> u64 {
        g.slices.keys().next_back().map_or(0, |s| s + 1)
    }

    /// Removes every object of the block.
    pub(super) fn delete_all(&self, objs: &BlockObjects) -> Result<(), StorageError> {
        // Markers first, so that a block half deleted is no replica.
        let (markers, rest): (Vec<&String>, Vec<&String>) = objs
            .keys
            .iter()
            .partition(|k| k.ends_with(&format!("/{GEN}")) || k.ends_with(&format!("/{FINAL}")));
        for k in markers.into_iter().chain(rest) {
            self.bucket.delete(k)?;
        }
        Ok(())
    }

    /// Removes generation `gs` of the block (its markers first).
    fn delete_gen(&self, objs: &BlockObjects, block: u64, gs: u64) -> Result<(), StorageError> {
        self.bucket.delete(&keys::marker(block, gs, GEN))?;
        self.bucket.delete(&keys::marker(block, gs, FINAL))?;
        for k in objs.keys_of(block, gs) {
            self.bucket.delete(k)?;
        }
        Ok(())
    }

    pub(super) fn create(&self, block: u64, gs: u64) -> Result<ObjectWriter, StorageError> {
        let objs = self.scan(block)?;
        self.delete_all(&objs)?;
        self.bucket.put(&keys::marker(block, gs, GEN), Vec::new())?;
        Ok(self.writer(block, gs, 0, 0, Vec::new()))
    }

    fn writer(&self, block: u64, gs: u64, seq: u64, len: u64, tail: Vec<u8>) -> ObjectWriter {
        ObjectWriter {
            bucket: self.bucket.clone(),
            io: self.io.clone(),
            block,
            gs,
            seq,
            len,
            resume: tail.clone(),
            tail,
        }
    }

    /// Cuts generation `gs` to `len` by one more slice: the partial chunk
    /// before `len` (verified, then rewritten with its own CRC), or an
    /// empty slice when `len` is on a chunk boundary. Returns the new
    /// generation's slices and its tail bytes.
    fn cut(&self, block: u64, gs: u64, g: &Gen, len: u64) -> Result<(Gen, Vec<u8>), StorageError> {
        let r = self.reader_of(block, gs, g)?;
        let have = r.len();
        if have < len {
            return Err(StorageError::TooShort {
                block,
                replica: r.path.clone(),
                len: have,
                wanted: len,
            });
        }
        let start = len / CS * CS;
        let mut tail = vec![0u8; (len - start) as usize];
        let n = r.read(start, &mut tail)?;
        if n < tail.len() {
            return Err(StorageError::TooShort {
                block,
                replica: r.path.clone(),
                len: start + n as u64,
                wanted: len,
            });
        }
        if have == len {
            return Ok((g.clone(), tail));
        }
        let s = SliceName {
            seq: Self::next_seq(g),
            start,
            end: len,
        };
        let mut crcs = Vec::new();
        chunk_crcs(&tail, &mut crcs);
        self.bucket.put(
            &keys::slice_key(block, gs, &s),
            encode_slice(&crcs, &[&tail]),
        )?;
        let mut g = g.clone();
        g.slices.insert(s.seq, (s, s.object_len()));
        Ok((g, tail))
    }

    pub(super) fn reopen(
        &self,
        block: u64,
        gs: u64,
        len: u64,
    ) -> Result<ObjectWriter, StorageError> {
        let objs = self.scan(block)?;
        let g = self.current_at(&objs, block, gs)?;
        if !g.open {
            self.bucket.put(&keys::marker(block, gs, GEN), Vec::new())?;
        }
        if g.fin {
            // Back to being written: the `gen` marker keeps it a replica.
            self.bucket.delete(&keys::marker(block, gs, FINAL))?;
        }
        let (g, tail) = self.cut(block, gs, &g, len)?;
        Ok(self.writer(block, gs, Self::next_seq(&g), len, tail))
    }

    /// Copies generation `old` to `new` (server-side copies; markers last,
    /// so an interrupted copy is no replica), then removes `old`.
    pub(super) fn restamp(&self, block: u64, old: u64, new: u64) -> Result<(), StorageError> {
        let objs = self.scan(block)?;
        let g = match self.current_at(&objs, block, old) {
            Ok(g) => g,
            Err(StorageError::StaleGenStamp { found, .. }) if found == new => return Ok(()),
            Err(e) => return Err(e),
        };
        if old == new {
            return Ok(());
        }
        for (s, _) in g.slices.values() {
            self.bucket.copy(
                &keys::slice_key(block, old, s),
                &keys::slice_key(block, new, s),
            )?;
        }
        if g.fin {
            self.bucket
                .put(&keys::marker(block, new, FINAL), Vec::new())?;
        }
        self.bucket
            .put(&keys::marker(block, new, GEN), Vec::new())?;
        self.delete_gen(&objs, block, old)
    }

    pub(super) fn truncate(
        &self,
        block: u64,
        gs: u64,
        new_gs: u64,
        len: u64,
    ) -> Result<(), StorageError> {
        self.restamp(block, gs, new_gs)?;
        let objs = self.scan(block)?;
        let g = self.current_at(&objs, block, new_gs)?;
        self.cut(block, new_gs, &g, len).map(|_| ())
    }

    /// Cuts to `len`, merges many small slices into one object, marks the
    /// replica finalized, then removes the slices nothing refers to any
    /// more and older generations.
    pub(super) fn finalize(&self, block: u64, gs: u64, len: u64) -> Result<(), StorageError> {
        let objs = self.scan(block)?;
        let g = self.current_at(&objs, block, gs)?;
        let (mut g, _) = self.cut(block, gs, &g, len)?;
        let n = g.slices.len();
        if n > MERGE_OVER && len < MERGE_BELOW * n as u64 {
            let r = self.reader_of(block, gs, &g)?;
            let mut data = vec![0u8; len as usize];
            let n = r.read(0, &mut data)?;
            if (n as u64) < len {
                return Err(StorageError::TooShort {
                    block,
                    replica: r.path.clone(),
                    len: n as u64,
                    wanted: len,
                });
            }
            let s = SliceName {
                seq: Self::next_seq(&g),
                start: 0,
                end: len,
            };
            let mut crcs = Vec::new();
            chunk_crcs(&data, &mut crcs);
            self.bucket.put(
                &keys::slice_key(block, gs, &s),
                encode_slice(&crcs, &[&data]),
            )?;
            g.slices.insert(s.seq, (s, s.object_len()));
        }
        if !g.fin {
            self.bucket
                .put(&keys::marker(block, gs, FINAL), Vec::new())?;
        }
        self.prune(&objs, block, gs, &g)
    }

    /// Removes what the replica `gs` no longer reads: slices another one
    /// cut away entirely, and every older generation (stale replicas, as a
    /// directory's restamped meta file leaves none).
    pub(super) fn prune(
        &self,
        objs: &BlockObjects,
        block: u64,
        gs: u64,
        g: &Gen,
    ) -> Result<(), StorageError> {
        let used: std::collections::HashSet<u64> = self
            .extents(block, gs, g)?
            .iter()
            .map(|e| e.slice.seq)
            .collect();
        for (seq, (s, _)) in &g.slices {
            // An empty slice that cut the replica at its end stays: it is
            // what makes the replica end there.
            let last = Some(seq) == g.slices.keys().next_back();
            if !used.contains(seq) && !last {
                self.bucket.delete(&keys::slice_key(block, gs, s))?;
            }
        }
        let older: Vec<u64> = objs.gens.keys().copied().filter(|o| *o < gs).collect();
        for o in older {
            self.delete_gen(objs, block, o)?;
        }
        Ok(())
    }

    /// A whole replica in one slice, straight to finalized: leftovers of
    /// the block go first; slice, then `final` (the commit).
    pub(super) fn write_finalized(
        &self,
        block: u64,
        gs: u64,
        data: &[u8],
        crcs: &[u32],
    ) -> Result<(), StorageError> {
        let objs = self.scan(block)?;
        self.delete_all(&objs)?;
        let s = SliceName {
            seq: 0,
            start: 0,
            end: data.len() as u64,
        };
        self.bucket
            .put(&keys::slice_key(block, gs, &s), encode_slice(crcs, &[data]))?;
        self.bucket.put(&keys::marker(block, gs, FINAL), Vec::new())
    }
}
