//! [`Counters`] on SQLite: rows of the `counters` table, ids handed out
//! from ranges reserved durably.

use rusqlite::params;

use super::MetaStore;
use crate::error::FsResult;
use crate::meta::counters::{Counter, Counters};
use crate::sync::lock;

/// How many ids one reservation takes.
const ID_BATCH: u64 = 1024;

impl Counters for MetaStore {
    /// Unique across restarts and power cuts, since whole ranges are
    /// reserved durably before use.
    fn alloc(&self, counter: Counter) -> FsResult<u64> {
        lock(&self.pool).take(counter, ID_BATCH, || {
            let first: i64 = self.durable(|tx| {
                Ok(tx.query_row(
                    "UPDATE counters SET value = value + ?2 WHERE name = ?1 RETURNING value - ?2",
                    params![counter.key(), ID_BATCH as i64],
                    |r| r.get(0),
                )?)
            })?;
            Ok(first as u64)
        })
    }

    /// Durable when it returns, so epochs stay strictly increasing across
    /// restarts and power cuts.
    fn reserve_epochs(&self, n: u64) -> FsResult<u64> {
        self.durable(|tx| {
            let v: i64 = tx.query_row(
                "UPDATE counters SET value = value + ?1 WHERE name = 'epoch_reserved' RETURNING value - ?1",
                [n as i64],
                |r| r.get(0),
            )?;
            Ok(v as u64 + 1)
        })
    }
}
