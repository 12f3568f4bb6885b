//! [`Meta`]: a whole metadata store, every narrow interface in one.
//!
//! A store implements [`Namespace`], [`BlockMap`], [`Counters`],
//! [`AuditLog`] and [`DatanodeRegistry`]; each is a set of atomic steps
//! that a backend runs as one SQLite transaction or as one etcd
//! transaction (retried on conflict), so a concurrent step of another
//! daemon sees all of a step or nothing. Code that needs one of them holds
//! that one (`Arc<dyn Meta>` upcasts to `Arc<dyn AuditLog>` and the
//! others); code that needs several holds the whole store.

use super::audit::AuditLog;
use super::blockmap::BlockMap;
use super::counters::Counters;
use super::namespace::Namespace;
use super::registry::DatanodeRegistry;
use super::types::StoreSpace;
use crate::error::FsResult;

/// A metadata store: all of the narrow interfaces, and what the store is.
pub trait Meta: Namespace + BlockMap + Counters + AuditLog + DatanodeRegistry {
    /// A short name for logs and `leases`: "sqlite" or "etcd".
    fn backend(&self) -> &'static str;
    /// The filesystem the store keeps its data on, when it is local.
    fn space(&self) -> FsResult<Option<StoreSpace>>;
}
