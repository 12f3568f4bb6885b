//! Synchronisation primitives, imported from one place so that a
//! concurrency checker (shuttle, loom) can replace them in tests.

pub use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
pub use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};

/// Locks a mutex, ignoring poisoning: a panic in one request must not turn
/// every later request on the same state into a second panic.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
