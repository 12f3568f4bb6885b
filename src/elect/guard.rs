//! What keeps a leader's command inside its lease whatever its daemon
//! does: renewals that never make the leader wait, and a watchdog that
//! stops the command's tree on time on its own.
//!
//! Every call to the daemon goes through the mount, and a daemon that is
//! stopped (`SIGSTOP`, a paused VM) or stuck answers none of them: an ioctl
//! or a control request then blocks for as long as the daemon does, while
//! etcd lets its claim run out and another daemon elects a new leader.
//! So the renewal ioctl runs on a thread of its own ([`Renewer`]: the
//! leader loop only looks whether the answer came), and the stop of the
//! command does not depend on the leader loop at all ([`Watchdog`]: a
//! thread that sends SIGTERM at the stop deadline and kills the tree at the
//! kill deadline, on its own clock, unless the loop moved the deadlines on
//! after a renewal in time). Whatever else the loop waits for, the command
//! is gone by the deadline.

use std::fs::File;
use std::io;
use std::sync::mpsc::{self, Receiver, TryRecvError};
use std::time::Duration;

use nix::sys::signal::Signal;

use super::leader_file::renew_valid;
use crate::clock::Clock;
use crate::proc_tree::Tree;
use crate::sync::{Arc, Condvar, Mutex, lock};

/// The answer to one renewal: when it was sent, and how long the daemon
/// vouches for the lease from then (`None`: a daemon that does not say).
pub(super) type Renewed = (Duration, io::Result<Option<Duration>>);

/// Renewals sent from a thread, one at a time.
pub(super) struct Renewer {
    file: Arc<File>,
    clock: Arc<dyn Clock>,
    in_flight: Option<(Duration, Receiver<io::Result<Option<Duration>>>)>,
}

impl Renewer {
    pub fn new(file: Arc<File>, clock: Arc<dyn Clock>) -> Self {
        Renewer {
            file,
            clock,
            in_flight: None,
        }
    }

    /// Whether a renewal was sent and has not been answered yet.
    pub fn pending(&self) -> bool {
        self.in_flight.is_some()
    }

    /// Sends a renewal unless one is under way. A thread that cannot be
    /// started counts as a failed renewal, answered at once.
    pub fn send(&mut self) {
        if self.in_flight.is_some() {
            return;
        }
        let (tx, rx) = mpsc::channel();
        let file = self.file.clone();
        let sent = self.clock.now();
        let spawned = std::thread::Builder::new()
            .name("elect-renew".into())
            .spawn(move || {
                let _ = tx.send(renew_valid(&file));
            });
        if let Err(e) = spawned {
            let (tx, rx) = mpsc::channel();
            let _ = tx.send(Err(e));
            self.in_flight = Some((sent, rx));
            return;
        }
        self.in_flight = Some((sent, rx));
    }

    /// The answer, once it came.
    pub fn poll(&mut self) -> Option<Renewed> {
        let (sent, rx) = self.in_flight.as_ref()?;
        let r = match rx.try_recv() {
            Ok(r) => r,
            Err(TryRecvError::Empty) => return None,
            Err(TryRecvError::Disconnected) => Err(io::Error::other(
                "the renewal thread ended without an answer",
            )),
        };
        let sent = *sent;
        self.in_flight = None;
        Some((sent, r))
    }
}

struct Deadlines {
    stop_at: Duration,
    kill_at: Duration,
    /// Set by the watchdog when it sent SIGTERM: the term is over, later
    /// renewals move nothing.
    stopped: bool,
    killed: bool,
    disarmed: bool,
}

/// Stops a command's tree at its deadlines, from a thread of its own.
pub(super) struct Watchdog {
    shared: Arc<(Mutex<Deadlines>, Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watchdog {
    /// Watches `tree`: SIGTERM (and SIGCONT) at `stop_at`, `cgroup.kill`
    /// and SIGKILL to every member at `kill_at`, times on `clock`.
    pub fn start(tree: Tree, clock: Arc<dyn Clock>, stop_at: Duration, kill_at: Duration) -> Self {
        let shared = Arc::new((
            Mutex::new(Deadlines {
                stop_at,
                kill_at,
                stopped: false,
                killed: false,
                disarmed: false,
            }),
            Condvar::new(),
        ));
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("elect-watchdog".into())
            .spawn(move || watch(&s, &tree, clock.as_ref()));
        let thread = match thread {
            Ok(t) => Some(t),
            Err(e) => {
                // Without it the leader loop still stops the command at
                // the deadline, unless the daemon stalls that loop.
                tracing::error!("cannot start the command's watchdog: {e}");
                None
            }
        };
        Watchdog { shared, thread }
    }

    /// New deadlines after a renewal; ignored once the watchdog acted.
    pub fn extend(&self, stop_at: Duration, kill_at: Duration) {
        let mut d = lock(&self.shared.0);
        if !d.stopped {
            d.stop_at = stop_at;
            d.kill_at = kill_at;
            self.shared.1.notify_all();
        }
    }

    /// Whether the watchdog has begun stopping the command.
    pub fn fired(&self) -> bool {
        lock(&self.shared.0).stopped
    }

    /// When it kills the tree.
    pub fn kill_at(&self) -> Duration {
        lock(&self.shared.0).kill_at
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        lock(&self.shared.0).disarmed = true;
        self.shared.1.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// How often the watchdog looks at its clock at most: a condvar wait can
/// wake late on a loaded machine, and the boot clock runs on while it
/// sleeps through a suspend.
const TICK: Duration = Duration::from_millis(20);

fn watch(shared: &(Mutex<Deadlines>, Condvar), tree: &Tree, clock: &dyn Clock) {
    let mut d = lock(&shared.0);
    loop {
        if d.disarmed || d.killed {
            return;
        }
        let now = clock.now();
        if now >= d.kill_at {
            d.stopped = true;
            d.killed = true;
            drop(d);
            tracing::warn!(
                pgid = tree.leader,
                "the lease may go to another leader soon: killing the command's tree"
            );
            tree.kill();
            return;
        }
        if now >= d.stop_at && !d.stopped {
            d.stopped = true;
            tracing::warn!(
                pgid = tree.leader,
                "no renewal by the deadline: stopping the command's tree"
            );
            tree.signal(Signal::SIGTERM);
            tree.signal(Signal::SIGCONT);
        }
        let next = if d.stopped { d.kill_at } else { d.stop_at };
        let wait = next.saturating_sub(now).min(TICK);
        d = match shared.1.wait_timeout(d, wait) {
            Ok((g, _)) => g,
            Err(p) => p.into_inner().0,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::SystemClock;

    fn sleeper() -> super::super::command::Running {
        super::super::command::spawn(
            &[
                "sh".into(),
                "-c".into(),
                "trap '' TERM; sleep 30 & sleep 30".into(),
            ],
            &[],
            -1,
            |_| Ok(()),
        )
        .expect("spawn")
    }

    /// The tree dies at the kill deadline although nobody else looks.
    #[test]
    fn the_watchdog_kills_the_tree_at_its_deadline_on_its_own() {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
        let mut r = sleeper();
        let tree = r.tree().clone();
        let t0 = clock.now();
        let dog = Watchdog::start(tree.clone(), clock.clone(), t0 + ms(100), t0 + ms(300));
        std::thread::sleep(ms(200));
        assert!(dog.fired());
        assert!(
            !r.group_gone(),
            "a command that ignores SIGTERM was killed early"
        );
        let mut gone_at = None;
        for _ in 0..200 {
            if r.group_gone() {
                gone_at = Some(clock.now() - t0);
                break;
            }
            std::thread::sleep(ms(5));
        }
        let at = gone_at.expect("the tree outlived its kill deadline");
        assert!(at >= ms(300), "killed at {at:?}");
        drop(dog);
    }

    /// Renewals in time keep moving the deadlines; dropping it disarms it.
    #[test]
    fn extended_deadlines_keep_the_command_running() {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
        let mut r = sleeper();
        let t0 = clock.now();
        let dog = Watchdog::start(r.tree().clone(), clock.clone(), t0 + ms(100), t0 + ms(150));
        for i in 1..=6 {
            std::thread::sleep(ms(50));
            let now = t0 + ms(50 * i);
            dog.extend(now + ms(100), now + ms(150));
        }
        assert!(!dog.fired());
        drop(dog);
        std::thread::sleep(ms(300));
        assert!(!r.group_gone());
        r.stop(ms(10));
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }
}
