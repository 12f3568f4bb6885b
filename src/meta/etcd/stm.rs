//! Optimistic transactions on etcd, after etcd's own STM ("software
//! transactional memory") in its serializable-snapshot mode.
//!
//! One attempt reads everything at a single revision (the first read's), so
//! it sees one consistent state of the store, and buffers its writes. The
//! commit is one etcd Txn whose compares assert that nothing the attempt
//! read has changed since: each key read must still have the mod_revision it
//! had (0 for a key that was absent), and each range scanned must hold no
//! key modified after the snapshot. When another daemon got there first the
//! Txn applies nothing and [`run`] starts a fresh attempt. A refusal
//! (NotFound, Exists, ...) is decided on a consistent snapshot, so it is
//! returned at once, as is an error of etcd itself.
//!
//! A range compare catches keys created or changed in the range, not keys
//! deleted from it: callers that act on a range's contents also read a key
//! that every deleter rewrites (a directory's inode for its entries, a
//! file's inode for its blocks).

use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

use etcd_client::{Compare, CompareOp, DeleteOptions, GetOptions, Txn, TxnOp};

use crate::error::{FsError, FsResult};
use crate::etcd::Etcd;
use crate::lease::LeaseError;
use crate::lease::cluster::EPOCH_SEQ_BITS;

/// Attempts before a step gives up under contention.
const MAX_TRIES: u32 = 100;

/// etcd refuses a Txn with more compares or more operations than its
/// `--max-txn-ops` (128 unless the operator raised it).
pub(super) const MAX_TXN_OPS: usize = 128;

/// Keys per request of a range scan, so that a large range does not hit the
/// gRPC message limit.
const PAGE: i64 = 1000;

/// Runs `f` as one atomic step: retried on a fresh snapshot while its
/// commit conflicts with another writer. `f` must not have side effects
/// outside the [`Stm`], since it may run several times.
pub(super) fn run<T>(etcd: &Etcd, mut f: impl FnMut(&mut Stm<'_>) -> FsResult<T>) -> FsResult<T> {
    for attempt in 0..MAX_TRIES {
        let mut s = Stm::new(etcd);
        match f(&mut s) {
            Ok(v) => {
                if s.commit()? {
                    return Ok(v);
                }
            }
            // The snapshot was compacted away under the attempt: not a
            // failure of the step, only of this attempt.
            Err(_) if s.stale => {}
            Err(e) => return Err(e),
        }
        backoff(attempt);
    }
    Err(FsError::Meta(format!(
        "etcd: gave up after {MAX_TRIES} conflicting attempts"
    )))
}

/// A short random sleep, growing with the attempt, so that writers racing
/// for the same key do not keep colliding in lockstep.
fn backoff(attempt: u32) {
    let cap_us = 200u64 << attempt.min(7); // 0.2 ms .. 25.6 ms
    let r = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    std::thread::sleep(Duration::from_micros(r % cap_us));
}

/// The end of the range of keys starting with `prefix` (which is ASCII).
pub(super) fn prefix_end(prefix: &str) -> String {
    let mut b = prefix.as_bytes().to_vec();
    if let Some(last) = b.last_mut() {
        *last += 1;
    }
    String::from_utf8_lossy(&b).into_owned()
}

/// The smallest key after `k`.
fn successor(k: &str) -> String {
    format!("{k}\0")
}

/// One attempt of an atomic step. Keys are relative to the filesystem's
/// prefix.
pub(super) struct Stm<'a> {
    etcd: &'a Etcd,
    /// The revision every read of this attempt sees; 0 before the first.
    rev: i64,
    /// Keys read: their mod_revision (0: absent) and value.
    reads: BTreeMap<String, (i64, Option<Vec<u8>>)>,
    /// Ranges scanned, [start, end).
    ranges: Vec<(String, String)>,
    /// Keys that must still have been created at these revisions (the
    /// claims a commit is made under; see [`Stm::require_claim`]).
    created: BTreeMap<String, i64>,
    /// Buffered writes: a value to put, or None to delete.
    writes: BTreeMap<String, Option<Vec<u8>>>,
    /// Buffered range deletions, [start, end). No buffered put lies inside
    /// one (etcd refuses a Txn that both puts and deletes a key).
    range_dels: Vec<(String, String)>,
    /// Keys to delete with the commit if the Txn has room for them, else
    /// right after it; see [`Stm::delete_later`].
    later: Vec<String>,
    stale: bool,
}

impl<'a> Stm<'a> {
    fn new(etcd: &'a Etcd) -> Stm<'a> {
        Stm {
            etcd,
            rev: 0,
            reads: BTreeMap::new(),
            ranges: Vec::new(),
            created: BTreeMap::new(),
            writes: BTreeMap::new(),
            range_dels: Vec::new(),
            later: Vec::new(),
            stale: false,
        }
    }

    fn full(&self, key: &str) -> String {
        self.etcd.key(key)
    }

    fn in_deleted_range(&self, key: &str) -> bool {
        self.range_dels
            .iter()
            .any(|(s, e)| s.as_str() <= key && key < e.as_str())
    }

    /// Runs one read, pinning the snapshot revision on the first.
    fn fetch(&mut self, opts: GetOptions, key: String) -> FsResult<etcd_client::GetResponse> {
        let opts = opts.with_revision(self.rev);
        let r = self
            .etcd
            .run(|mut c| async move { c.get(key, Some(opts)).await });
        let resp = match r {
            Ok(resp) => resp,
            Err(FsError::Meta(m)) if m.contains("compacted") => {
                self.stale = true;
                return Err(FsError::Meta(m));
            }
            Err(e) => return Err(e),
        };
        if self.rev == 0 {
            self.rev = resp
                .header()
                .map(|h| h.revision())
                .ok_or_else(|| FsError::Meta("etcd answered without a revision".into()))?;
        }
        Ok(resp)
    }

    /// The value of `key` as this attempt sees it (its own writes included).
    pub fn get(&mut self, key: &str) -> FsResult<Option<Vec<u8>>> {
        if let Some(w) = self.writes.get(key) {
            return Ok(w.clone());
        }
        if self.in_deleted_range(key) {
            return Ok(None);
        }
        if let Some((_, v)) = self.reads.get(key) {
            return Ok(v.clone());
        }
        let mut resp = self.fetch(GetOptions::new(), self.full(key))?;
        let (mr, v) = match resp.take_kvs().into_iter().next() {
            Some(kv) => (kv.mod_revision(), Some(kv.into_key_value().1)),
            None => (0, None),
        };
        self.reads.insert(key.to_string(), (mr, v.clone()));
        Ok(v)
    }

    /// Makes this attempt's commit conditional on file `ino`'s claim
    /// being the one `epoch` was granted under: its key created at
    /// revision `epoch >> EPOCH_SEQ_BITS` (a claim's key is created once
    /// and deleted when it ends; a later claim is a new key). Decided on
    /// the snapshot first, so a claim already gone fails the step at once
    /// with `Fenced` instead of being retried; the commit compares it
    /// again.
    pub fn require_claim(&mut self, ino: u64, epoch: u64) -> FsResult<()> {
        let key = crate::etcd::claim_key(ino);
        let base = (epoch >> EPOCH_SEQ_BITS) as i64;
        let created = match self.created.get(&key) {
            Some(c) => *c,
            None => {
                let resp = self.fetch(GetOptions::new().with_keys_only(), self.full(&key))?;
                resp.kvs().first().map_or(0, |kv| kv.create_revision())
            }
        };
        if created != base || base == 0 {
            return Err(FsError::Lease(LeaseError::Fenced { file: ino, epoch }));
        }
        self.created.insert(key, base);
        Ok(())
    }

    /// The keys in [start, end) in order, with their values, as this
    /// attempt sees them; at most `limit` of them.
    pub fn scan(
        &mut self,
        start: &str,
        end: &str,
        limit: Option<usize>,
    ) -> FsResult<Vec<(String, Vec<u8>)>> {
        if start >= end {
            return Ok(Vec::new());
        }
        let mut got: BTreeMap<String, Vec<u8>> = BTreeMap::new();
        let mut from = start.to_string();
        // Enough for `limit` answers even if this attempt deleted some keys.
        let page = match limit {
            Some(l) => {
                let hidden = self
                    .writes
                    .range(start.to_string()..end.to_string())
                    .filter(|(_, w)| w.is_none())
                    .count();
                ((l + hidden) as i64).clamp(1, PAGE)
            }
            None => PAGE,
        };
        let full_end = self.full(end);
        let upto = loop {
            let opts = GetOptions::new()
                .with_range(full_end.clone())
                .with_limit(page);
            let mut resp = self.fetch(opts, self.full(&from))?;
            let more = resp.more();
            let mut last = None;
            for kv in resp.take_kvs() {
                let (k, v) = kv.into_key_value();
                let k = self.relative(k)?;
                last = Some(k.clone());
                got.insert(k, v);
            }
            let Some(last) = last.filter(|_| more) else {
                break None;
            };
            if limit.is_some_and(|l| self.overlay(&got, start, end, Some(&last)).len() >= l) {
                break Some(last);
            }
            from = successor(&last);
        };
        self.ranges.push((start.to_string(), end.to_string()));
        let mut out: Vec<_> = self
            .overlay(&got, start, end, upto.as_deref())
            .into_iter()
            .collect();
        if let Some(l) = limit {
            out.truncate(l);
        }
        Ok(out)
    }

    /// `got` (read from etcd) with this attempt's own writes applied, up to
    /// and including `upto` when the scan stopped early.
    fn overlay(
        &self,
        got: &BTreeMap<String, Vec<u8>>,
        start: &str,
        end: &str,
        upto: Option<&str>,
    ) -> BTreeMap<String, Vec<u8>> {
        let mut m: BTreeMap<String, Vec<u8>> = got
            .iter()
            .filter(|(k, _)| !self.in_deleted_range(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (k, w) in self.writes.range(start.to_string()..end.to_string()) {
            if upto.is_some_and(|u| k.as_str() > u) {
                break;
            }
            match w {
                Some(v) => m.insert(k.clone(), v.clone()),
                None => m.remove(k),
            };
        }
        m
    }

    fn relative(&self, key: Vec<u8>) -> FsResult<String> {
        let k =
            String::from_utf8(key).map_err(|_| FsError::Meta("non-UTF-8 key in etcd".into()))?;
        k.strip_prefix(self.etcd.prefix())
            .map(str::to_string)
            .ok_or_else(|| FsError::Meta(format!("etcd returned a foreign key {k}")))
    }

    pub fn put(&mut self, key: &str, value: Vec<u8>) {
        // Keep the put out of any pending range deletion by splitting it.
        let mut split = Vec::with_capacity(self.range_dels.len() + 1);
        for (s, e) in self.range_dels.drain(..) {
            if s.as_str() <= key && key < e.as_str() {
                split.push((s, key.to_string()));
                split.push((successor(key), e));
            } else {
                split.push((s, e));
            }
        }
        self.range_dels = split.into_iter().filter(|(s, e)| s < e).collect();
        self.writes.insert(key.to_string(), Some(value));
    }

    pub fn delete(&mut self, key: &str) {
        if self.in_deleted_range(key) {
            self.writes.remove(key);
        } else {
            self.writes.insert(key.to_string(), None);
        }
    }

    /// Deletes every key in [start, end) with one operation, however many
    /// there are.
    pub fn delete_range(&mut self, start: &str, end: &str) {
        self.writes
            .retain(|k, _| !(start <= k.as_str() && k.as_str() < end));
        self.range_dels.push((start.to_string(), end.to_string()));
    }

    /// Deletes a key that only an index points through and whose staleness
    /// readers tolerate: with the commit when the Txn has room, otherwise
    /// right after it, unless it was written again in between.
    pub fn delete_later(&mut self, key: String) {
        match self.writes.get_mut(&key) {
            Some(w) => *w = None,
            None => self.later.push(key),
        }
    }

    /// Tries to apply the buffered writes; false on a conflict.
    fn commit(&mut self) -> FsResult<bool> {
        let mut later: Vec<String> = std::mem::take(&mut self.later)
            .into_iter()
            .filter(|k| !self.writes.contains_key(k) && !self.in_deleted_range(k))
            .collect();
        later.sort();
        later.dedup();
        if self.writes.is_empty() && self.range_dels.is_empty() && later.is_empty() {
            return Ok(true);
        }
        let mut cmps: Vec<Compare> = self
            .reads
            .iter()
            .map(|(k, (mr, _))| Compare::mod_revision(self.full(k), CompareOp::Equal, *mr))
            .collect();
        cmps.extend(
            self.created
                .iter()
                .map(|(k, rev)| Compare::create_revision(self.full(k), CompareOp::Equal, *rev)),
        );
        cmps.extend(self.ranges.iter().map(|(s, e)| {
            Compare::mod_revision(self.full(s), CompareOp::Less, self.rev + 1)
                .with_range(self.full(e))
        }));
        let mut ops: Vec<TxnOp> = self
            .writes
            .iter()
            .map(|(k, w)| match w {
                Some(v) => TxnOp::put(self.full(k), v.clone(), None),
                None => TxnOp::delete(self.full(k), None),
            })
            .collect();
        ops.extend(self.range_dels.iter().map(|(s, e)| {
            TxnOp::delete(
                self.full(s),
                Some(DeleteOptions::new().with_range(self.full(e))),
            )
        }));
        let room = MAX_TXN_OPS.saturating_sub(ops.len()).min(later.len());
        let after = later.split_off(room);
        ops.extend(later.iter().map(|k| TxnOp::delete(self.full(k), None)));
        if cmps.len() > MAX_TXN_OPS || ops.len() > MAX_TXN_OPS {
            return Err(FsError::Meta(format!(
                "one metadata step needs {} etcd compares and {} operations, more than etcd's --max-txn-ops ({MAX_TXN_OPS})",
                cmps.len(),
                ops.len()
            )));
        }
        let txn = Txn::new().when(cmps).and_then(ops);
        let resp = self.etcd.run(|mut c| async move { c.txn(txn).await })?;
        if !resp.succeeded() {
            return Ok(false);
        }
        if !after.is_empty() {
            let rev = resp.header().map(|h| h.revision()).unwrap_or(i64::MAX - 1);
            self.delete_after(&after, rev);
        }
        Ok(true)
    }

    /// Deletes `keys` unless one was written after revision `rev` (the
    /// commit that made them garbage). Best effort: a key left behind is
    /// garbage its readers already tolerate.
    fn delete_after(&self, keys: &[String], rev: i64) {
        let guarded = |ks: &[String]| {
            let cmps: Vec<Compare> = ks
                .iter()
                .map(|k| Compare::mod_revision(self.full(k), CompareOp::Less, rev + 1))
                .collect();
            let ops: Vec<TxnOp> = ks
                .iter()
                .map(|k| TxnOp::delete(self.full(k), None))
                .collect();
            let txn = Txn::new().when(cmps).and_then(ops);
            self.etcd
                .run(|mut c| async move { c.txn(txn).await })
                .map(|r| r.succeeded())
        };
        for chunk in keys.chunks(MAX_TXN_OPS) {
            match guarded(chunk) {
                Ok(true) => {}
                // One of them was written again: keep that one only.
                Ok(false) => {
                    for k in chunk {
                        if let Err(e) = guarded(std::slice::from_ref(k)) {
                            tracing::warn!(key = %k, "cannot delete a stale etcd key: {e}");
                        }
                    }
                }
                Err(e) => tracing::warn!("cannot delete {} stale etcd keys: {e}", chunk.len()),
            }
        }
    }
}
