//! Metadata: inodes, directory entries, xattrs, block lists, files under
//! construction, id counters and the election audit table.
//!
//! [`Meta`] is the one interface the filesystem uses; two backends implement
//! it. [`MetaStore`] (SQLite, the default) serves one daemon; operators can
//! inspect it with the `sqlite3` shell (`DATA/meta.db`). [`EtcdMeta`] lets
//! several daemons share one namespace.

mod backend;
pub mod etcd;
pub mod sqlite;
mod types;

pub use backend::{Change, Meta, list_all};
pub use etcd::EtcdMeta;
pub use sqlite::MetaStore;
pub use types::*;
