//! Metadata persisted in SQLite: inodes, directory entries, xattrs, block
//! lists and files under construction. Operators can inspect it with the
//! `sqlite3` shell (`DATA/meta.db`).

mod schema;
pub mod store;

pub use store::*;
