//! Metadata: inodes, directory entries, xattrs, block lists, files under
//! construction, id counters, the datanode registry and the election
//! audit table.
//!
//! The filesystem sees it through narrow interfaces, each a set of atomic
//! steps: [`Namespace`] (inodes, entries, xattrs), [`BlockMap`] (blocks,
//! files under construction, the write path's commits and their
//! durability), [`Counters`] (ids and epochs), [`AuditLog`] (elections'
//! events and durable fences) and [`DatanodeRegistry`]; [`Meta`] is all of
//! them. The namespace rules (what rename, unlink, link, create and the
//! xattr changes refuse and change) are written once, in [`rules`], for
//! both backends. [`MetaStore`] (SQLite, the default) serves one daemon;
//! operators can inspect it with the `sqlite3` shell (`DATA/meta.db`).
//! [`EtcdMeta`] lets several daemons share one namespace.

mod audit;
mod backend;
mod blockmap;
mod counters;
pub mod etcd;
mod namespace;
mod registry;
mod rules;
pub mod sqlite;
mod types;

pub use audit::{AuditLog, MAX_EVENTS_PER_USER};
pub use backend::Meta;
pub use blockmap::{BlockMap, Change};
pub use counters::{Counter, Counters};
pub use etcd::EtcdMeta;
pub use namespace::{Namespace, list_all};
pub use registry::DatanodeRegistry;
pub use sqlite::MetaStore;
pub use types::*;
