//! The daemon's control socket: one JSON request per line, one JSON answer
//! per line, for `leasefs leases`, `recover-lease`, `fsck MOUNTPOINT`,
//! `elect`, `stats` and `datanode ...`, which need more than an xattr can
//! carry.
//!
//! It is an interface for every user of the mount: the socket is
//! `DATA/control.sock` with mode 0666, and the same service listens on an
//! abstract socket named by the mount root's `user.leasefs.control`, for
//! users who cannot reach the data directory (root's default one is under
//! `/root`). Anyone may connect; each request is authorized from the
//! peer's credentials (`SO_PEERCRED`) in [`requests`]. Bounds keep one
//! client from holding the service: a request is one line of at most
//! [`MAX_REQUEST`] bytes that must arrive within [`REQUEST_TIMEOUT`], at
//! most [`MAX_CONNECTIONS`] connections are served at once (more wait in
//! the socket's backlog) and at most [`MAX_PER_USER`] of them per user
//! (more are refused with an error line).

mod peer;
pub(crate) mod requests;
mod sight;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

pub use self::peer::Peer;
use crate::daemon::fatal::Fatal;
use crate::dnadmin::Admin;
use crate::fs::core::Core;
use crate::sync::{Arc, Condvar, Mutex, lock};

/// The longest request line (an audit event's reason is the longest
/// field anyone sends).
pub const MAX_REQUEST: usize = 64 * 1024;
/// How long a client may take to send its request line.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the daemon waits for a client to take an answer.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections served at once; more wait in the listen backlog.
pub const MAX_CONNECTIONS: usize = 16;
/// Connections of one user served at once; more are refused.
pub const MAX_PER_USER: usize = 4;

pub fn socket_path(data: &Path) -> PathBuf {
    data.join("control.sock")
}

/// The abstract socket's name of the daemon serving `data`: unguessable
/// (so that nobody can bind it first), published through the mount root's
/// `user.leasefs.control` xattr.
fn abstract_name(data: &Path) -> String {
    use std::hash::BuildHasher;
    let salt = std::collections::hash_map::RandomState::new().hash_one(data);
    format!("leasefs-control-{}-{salt:016x}", std::process::id())
}

/// The connections being served, in total and by user.
#[derive(Default)]
struct Slots {
    busy: Mutex<(usize, HashMap<u32, usize>)>,
    freed: Condvar,
}

impl Slots {
    /// Waits until fewer than [`MAX_CONNECTIONS`] are served.
    fn wait_for_room(&self) {
        let mut b = lock(&self.busy);
        while b.0 >= MAX_CONNECTIONS {
            b = self.freed.wait(b).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Takes a slot for `uid`, unless that user has all of theirs.
    fn take(&self, uid: u32) -> bool {
        let mut b = lock(&self.busy);
        let mine = b.1.entry(uid).or_default();
        if *mine >= MAX_PER_USER {
            return false;
        }
        *mine += 1;
        b.0 += 1;
        true
    }

    fn give(&self, uid: u32) {
        let mut b = lock(&self.busy);
        b.0 = b.0.saturating_sub(1);
        if let Some(n) = b.1.get_mut(&uid) {
            *n -= 1;
            if *n == 0 {
                b.1.remove(&uid);
            }
        }
        self.freed.notify_all();
    }
}

/// Binds the control socket at `path` in `data`, with mode 0666 (every
/// user may connect; requests are authorized one by one). It is bound and
/// chmodded in a new directory of mode 0700, which no other user can
/// enter or change, and renamed into place (replacing an old socket), so
/// the daemon never changes the mode of a path another user could have
/// replaced by a link; the data directory itself is checked at mount
/// (SEMANTICS "The daemon", *Datanode directories*).
fn bind_private(data: &Path, path: &Path) -> std::io::Result<UnixListener> {
    use std::os::unix::fs::DirBuilderExt;
    let private = data.join(format!(".c.{}", std::process::id()));
    // A leftover of a daemon of the same pid (a container restarted).
    let _ = std::fs::remove_dir_all(&private);
    std::fs::DirBuilder::new().mode(0o700).create(&private)?;
    let bound = private.join("s");
    let r = UnixListener::bind(&bound).and_then(|l| {
        std::fs::set_permissions(&bound, std::fs::Permissions::from_mode(0o666))?;
        std::fs::rename(&bound, path)?;
        Ok(l)
    });
    let _ = std::fs::remove_file(&bound);
    let _ = std::fs::remove_dir(&private);
    r
}

/// Starts the control server on both sockets. Its accept loops are
/// vital threads (see [`Fatal`]).
pub fn serve(
    core: Arc<Core>,
    admin: Arc<Admin>,
    data: &Path,
    mountpoint: &Path,
    fatal: Arc<Fatal>,
) {
    let slots = Arc::new(Slots::default());
    let mnt = mountpoint.to_path_buf();
    let path = socket_path(data);
    match bind_private(data, &path) {
        Ok(l) => {
            accept_loop(l, "control", &core, &admin, &mnt, &slots, &fatal);
        }
        Err(e) => tracing::error!("control socket {}: {e}", path.display()),
    }
    let name = abstract_name(data);
    let bound = SocketAddr::from_abstract_name(name.as_bytes())
        .and_then(|addr| UnixListener::bind_addr(&addr));
    match bound {
        Ok(l) => {
            accept_loop(l, "control-abstract", &core, &admin, &mnt, &slots, &fatal);
            core.set_control_address(name);
        }
        Err(e) => tracing::warn!("abstract control socket: {e}"),
    }
}

fn accept_loop(
    listener: UnixListener,
    name: &str,
    core: &Arc<Core>,
    admin: &Arc<Admin>,
    mnt: &Path,
    slots: &Arc<Slots>,
    fatal: &Arc<Fatal>,
) {
    let (core, admin, mnt, slots) = (
        core.clone(),
        admin.clone(),
        mnt.to_path_buf(),
        slots.clone(),
    );
    fatal.spawn(name, move || {
        loop {
            slots.wait_for_room();
            let conn = match listener.accept() {
                Ok((c, _)) => c,
                Err(e) => {
                    tracing::warn!("control socket: accept: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
            };
            let peer = match Peer::of(&conn) {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!("control socket: no peer credentials: {e}");
                    continue;
                }
            };
            if !slots.take(peer.uid) {
                let _ = conn.set_write_timeout(Some(WRITE_TIMEOUT));
                let msg = format!(
                    "too many control connections of uid {} at once (at most {MAX_PER_USER}); try again",
                    peer.uid
                );
                let _ = writeln!(&conn, "{}", json!({ "error": msg }));
                continue;
            }
            let (core, admin, mnt, slots) =
                (core.clone(), admin.clone(), mnt.clone(), slots.clone());
            let r = std::thread::Builder::new()
                .name("control-conn".into())
                .spawn(move || {
                    let uid = peer.uid;
                    // A panic answering one request ends that connection only.
                    if let Err(why) = crate::fault::catch(|| handle(&core, &admin, &mnt, &peer, conn)) {
                        tracing::error!(uid, "control request panicked: {why}");
                    }
                    slots.give(uid);
                });
            if let Err(e) = r {
                tracing::error!("control socket: cannot start a connection thread: {e}");
            }
        }
    });
}

/// Serves one connection: requests, one per line, until the client
/// closes it, sends nothing for [`REQUEST_TIMEOUT`], or breaks a bound.
fn handle(core: &Arc<Core>, admin: &Admin, mnt: &Path, peer: &Peer, conn: UnixStream) {
    let _ = conn.set_write_timeout(Some(WRITE_TIMEOUT));
    let Ok(mut w) = conn.try_clone() else { return };
    let mut r = BufReader::new(conn);
    loop {
        let line = match read_request(&mut r) {
            Ok(Some(l)) => l,
            Ok(None) => return,
            Err(e) => {
                let _ = writeln!(w, "{}", json!({ "error": e }));
                return;
            }
        };
        let answer = match serde_json::from_slice::<Value>(&line) {
            Ok(req) => requests::answer(core, admin, mnt, peer, &req, &|| hung_up(&w)),
            Err(e) => json!({ "error": format!("bad request: {e}") }),
        };
        if writeln!(w, "{answer}").is_err() {
            return;
        }
    }
}

/// Whether the client closed its end of the connection (it waits for
/// its answer with the socket open; a client killed or interrupted closes
/// it). `POLLHUP` on a Unix stream socket means both directions are shut,
/// so a client that only shut its writing side still counts as waiting.
fn hung_up(conn: &UnixStream) -> bool {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use std::os::fd::AsFd;
    let mut fds = [PollFd::new(conn.as_fd(), PollFlags::empty())];
    match poll(&mut fds, PollTimeout::ZERO) {
        Ok(n) if n > 0 => fds[0]
            .revents()
            .is_some_and(|r| r.intersects(PollFlags::POLLHUP | PollFlags::POLLERR)),
        _ => false,
    }
}

/// Reads one request line within the size and time bounds; `None` at the
/// end of the connection.
fn read_request(r: &mut BufReader<UnixStream>) -> Result<Option<Vec<u8>>, String> {
    let deadline = Instant::now() + REQUEST_TIMEOUT;
    let mut line = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!(
                "request not received within {} s",
                REQUEST_TIMEOUT.as_secs()
            ));
        }
        let _ = r.get_ref().set_read_timeout(Some(left));
        let room = (MAX_REQUEST + 1 - line.len()) as u64;
        match r.by_ref().take(room).read_until(b'\n', &mut line) {
            Ok(0) if line.is_empty() => return Ok(None),
            Ok(0) => return Err("request ended without a newline".into()),
            Ok(_) if line.ends_with(b"\n") => {
                line.pop();
                return Ok(Some(line));
            }
            Ok(_) if line.len() > MAX_REQUEST => {
                return Err(format!("request longer than {MAX_REQUEST} bytes"));
            }
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("control socket: {e}")),
        }
    }
}
