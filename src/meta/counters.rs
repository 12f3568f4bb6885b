//! [`Counters`]: the id counters ([`Counter`]) and the epoch high-water
//! mark, unique and increasing across restarts and across every daemon
//! sharing a backend.

use crate::error::FsResult;

/// An id counter of the store. Its [`Counter::key`] is the name it is
/// stored under (a row of SQLite's `counters` table, the etcd key
/// `c/<key>`): part of the on-disk schema, never to change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Counter {
    /// Inode numbers.
    Ino,
    /// Listing cookies of directory entries (docs/SEMANTICS.md,
    /// "Directory listings").
    Cookie,
    /// Block ids.
    Block,
    /// Generation stamps of blocks.
    GenStamp,
}

impl Counter {
    pub const ALL: [Counter; 4] = [
        Counter::Ino,
        Counter::Cookie,
        Counter::Block,
        Counter::GenStamp,
    ];

    /// The name the counter is stored under.
    pub const fn key(self) -> &'static str {
        match self {
            Counter::Ino => "next_ino",
            Counter::Cookie => "next_cookie",
            Counter::Block => "next_block",
            Counter::GenStamp => "next_gs",
        }
    }

    /// Its value in a new filesystem: inode 1 is the root, cookies start
    /// after the offsets of `.` and `..`, generation stamps at 1000 as in
    /// HDFS.
    pub const fn first(self) -> u64 {
        match self {
            Counter::Ino => 2,
            Counter::Cookie => super::types::FIRST_COOKIE,
            Counter::Block => 1,
            Counter::GenStamp => 1000,
        }
    }

    /// Its place in a per-counter table such as an id pool.
    pub const fn index(self) -> usize {
        self as usize
    }
}

/// The store's counters.
pub trait Counters: Send + Sync {
    /// A fresh id of `counter`, unique across restarts and across every
    /// daemon sharing the backend.
    fn alloc(&self, counter: Counter) -> FsResult<u64>;
    /// Reserves `n` epochs above the persisted high-water mark and returns
    /// the first; epochs stay strictly increasing across restarts.
    fn reserve_epochs(&self, n: u64) -> FsResult<u64>;
}

/// Ranges of ids a store reserved, one per [`Counter`], handed out
/// without a round trip to the store each: (next, end).
#[derive(Debug, Default)]
pub(super) struct IdPool([(u64, u64); Counter::ALL.len()]);

impl IdPool {
    /// The next id of `c`, reserving a new range of `batch` ids with
    /// `reserve` (which returns its first id) when the current one is used
    /// up.
    pub(super) fn take(
        &mut self,
        c: Counter,
        batch: u64,
        reserve: impl FnOnce() -> FsResult<u64>,
    ) -> FsResult<u64> {
        let (next, end) = &mut self.0[c.index()];
        if *next >= *end {
            let first = reserve()?;
            *next = first;
            *end = first + batch;
        }
        let id = *next;
        *next += 1;
        Ok(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The stored names are the schema's: SQLite's `counters` rows and
    /// etcd's `c/` keys of existing filesystems.
    #[test]
    fn counters_keep_their_stored_names() {
        let keys: Vec<&str> = Counter::ALL.iter().map(|c| c.key()).collect();
        assert_eq!(keys, ["next_ino", "next_cookie", "next_block", "next_gs"]);
        for (i, c) in Counter::ALL.iter().enumerate() {
            assert_eq!(c.index(), i);
        }
    }

    #[test]
    fn pool_reserves_a_range_when_used_up() {
        let mut p = IdPool::default();
        let mut reserved = Vec::new();
        let mut next_first = 100;
        let mut take = |p: &mut IdPool, c| {
            p.take(c, 3, || {
                reserved.push(next_first);
                next_first += 3;
                Ok(next_first - 3)
            })
            .unwrap()
        };
        let got: Vec<u64> = (0..4).map(|_| take(&mut p, Counter::Block)).collect();
        assert_eq!(got, [100, 101, 102, 103]);
        assert_eq!(take(&mut p, Counter::GenStamp), 106, "a range of its own");
        assert_eq!(reserved, [100, 103, 106]);
    }
}
