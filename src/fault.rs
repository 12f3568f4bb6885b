//! Panic containment: the daemon's panic hook, the helpers that turn a
//! panic into an error of the one request (or stream) it happened in, and
//! the test-only hook that makes a chosen place panic.
//!
//! For developers, not users: a daemon started with the environment
//! variable `LEASEFS_TEST_PANIC=POINT[,POINT...]` panics at each named
//! point once its trigger is met. It is read once, when the daemon starts,
//! and it is not a mount option on purpose: nothing a user configures can
//! reach it. Points and triggers:
//! - `request`: a FUSE request about the name `leasefs-test-panic`
//!   (lookup, create) panics on the request thread;
//! - `stream`: the stream worker panics on a packet whose data starts with
//!   `leasefs-test-panic`;
//! - `monitor`, `renewer`, `heartbeat`, `housekeeping`, `waiters`: that
//!   background thread panics at its first round after the mount root has
//!   an entry named `leasefs-test-panic`.
//!
//! The integration tests (tests/panics.rs) use it to show that a panic
//! costs one request `EIO`, fails a stream's waiters instead of leaving
//! them hanging, and that a dead background thread takes the daemon down.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::OnceLock;

/// The name (and data prefix) that trips an armed point.
pub const TRIGGER: &str = "leasefs-test-panic";

/// The environment variable that arms points.
pub const ENV: &str = "LEASEFS_TEST_PANIC";

static ARMED: OnceLock<Vec<String>> = OnceLock::new();

/// Reads [`ENV`] (once; later calls change nothing).
pub fn arm_from_env() {
    let points = std::env::var(ENV)
        .map(|v| v.split(',').map(|p| p.trim().to_string()).collect())
        .unwrap_or_default();
    if ARMED.set(points).is_ok() && is_any_armed() {
        tracing::warn!("{ENV} is set: test panics armed at {:?}", armed_points());
    }
}

fn armed_points() -> &'static [String] {
    ARMED.get().map(Vec::as_slice).unwrap_or(&[])
}

fn is_any_armed() -> bool {
    !armed_points().is_empty()
}

/// Whether `point` is armed (cheap: a test of an empty list in a daemon
/// started without [`ENV`]).
pub fn armed(point: &str) -> bool {
    armed_points().iter().any(|p| p == point)
}

/// Panics when `point` is armed and `trigger` says so.
pub fn panic_if(point: &str, trigger: impl FnOnce() -> bool) {
    if armed(point) && trigger() {
        panic!("{ENV}: injected panic at '{point}'");
    }
}

/// The message of a caught panic.
pub fn message(p: &(dyn Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "(no message)".to_string()
    }
}

/// Runs `f`; a panic becomes `Err(message)` (logged by the hook).
pub fn catch<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|p| message(&*p))
}

/// Logs every panic through `tracing` (with the thread's name and where it
/// happened) before it unwinds, so that a contained panic still leaves its
/// trace in the daemon's log, whichever thread it happened on.
pub fn install_hook() {
    std::panic::set_hook(Box::new(|info| {
        let thread = std::thread::current();
        let name = thread.name().unwrap_or("unnamed");
        let at = info
            .location()
            .map(|l| format!("{}:{}", l.file(), l.line()))
            .unwrap_or_default();
        tracing::error!(thread = name, at, "panic: {}", message(info.payload()));
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caught_panic_becomes_its_message() {
        assert_eq!(catch(|| 7), Ok(7));
        assert_eq!(
            catch(|| -> u8 { panic!("boom {}", 1) }),
            Err("boom 1".into())
        );
        assert_eq!(catch(|| -> u8 { panic!("static") }), Err("static".into()));
    }

    #[test]
    fn nothing_is_armed_without_the_variable() {
        // The unit tests never set the variable.
        assert!(!armed("request"));
        panic_if("request", || true);
    }
}
