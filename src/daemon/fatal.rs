//! How a dead background thread takes the daemon down ([`Fatal`]).

use std::path::{Path, PathBuf};

use crate::sync::{Arc, Mutex};

/// Exit status of a daemon taken down by a dead background thread
/// (`EX_SOFTWARE`).
pub const FATAL_EXIT: i32 = 70;

/// How a background thread that dies takes the daemon down: the lease
/// monitor, the renewer, heartbeats, housekeeping, the control server and
/// the etcd keep-alives are each what some guarantee rests on (expiry,
/// renewal, liveness, fencing), so the daemon must not run on without one.
/// It unmounts cleanly when it can (nothing open); otherwise it detaches
/// the mount and exits at once, as a crash would (files being written are
/// recovered at the next mount). Either way the exit status is non-zero.
pub struct Fatal {
    mountpoint: PathBuf,
    pub(super) unmounter: Mutex<Option<fuser::SessionUnmounter>>,
    pub(super) why: Mutex<Option<String>>,
}

impl Fatal {
    pub(super) fn new(mountpoint: PathBuf) -> Arc<Fatal> {
        Arc::new(Fatal {
            mountpoint,
            unmounter: Default::default(),
            why: Default::default(),
        })
    }

    /// Thread `thread` died of `why`.
    pub fn die(&self, thread: &str, why: &str) {
        tracing::error!(
            thread,
            "background thread died ({why}); the daemon cannot run on without it: stopping"
        );
        crate::sync::lock(&self.why).get_or_insert_with(|| format!("{thread} died: {why}"));
        if let Some(mut u) = crate::sync::lock(&self.unmounter).take() {
            match u.unmount() {
                Ok(()) => return,
                Err(e) => tracing::error!("clean unmount impossible ({e}); detaching the mount"),
            }
        }
        detach(&self.mountpoint);
        std::process::exit(FATAL_EXIT);
    }

    /// Runs `f` on a thread named `name`; a panic in it is fatal.
    pub fn spawn(self: &Arc<Self>, name: &str, f: impl FnOnce() + Send + 'static) {
        let me = self.clone();
        let thread = name.to_string();
        let r = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                if let Err(why) = crate::fault::catch(f) {
                    me.die(&thread, &why);
                }
            });
        if let Err(e) = r {
            tracing::error!("cannot start {name}: {e}");
            self.die(name, &format!("cannot start: {e}"));
        }
    }
}

/// Lazily detaches the mount (a crashed daemon's mount would otherwise be
/// left behind, giving ENOTCONN until `fusermount3 -uz`).
fn detach(mountpoint: &Path) {
    if nix::mount::umount2(mountpoint, nix::mount::MntFlags::MNT_DETACH).is_ok() {
        return;
    }
    let _ = std::process::Command::new("fusermount3")
        .arg("-uz")
        .arg(mountpoint)
        .status();
}
