//! Fencing through the filesystem and the control socket, in process: a
//! real core over a SQLite store and one datanode (see `fs::testing`), and
//! a real process in a session of its own as the term's command (fencing
//! goes by what /proc says about a caller).

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use crate::config::MountOptions;
use crate::error::{FsError, FsResult};
use crate::fs::TermRegistration;
use crate::fs::core::Core;
use crate::fs::request::Caller;
use crate::fs::testing::{TestFs, caller, node as file, wait};
use crate::meta::{AttrChange, Kind, ROOT_INO};
use crate::proc_tree;
use crate::sync::Arc;

fn open(c: &Arc<Core>, ino: u64, flags: i32, who: Caller) -> FsResult<u64> {
    wait(|r| c.open(ino, flags, who, r)).map(|o: crate::fs::request::Opened| o.fh)
}

/// A command: `sleep` as the leader of a session of its own.
fn command() -> Child {
    let c = Command::new("setsid")
        .args(["sleep", "30"])
        .spawn()
        .expect("setsid sleep");
    let pid = c.id();
    let end = Instant::now() + Duration::from_secs(5);
    while proc_tree::stat(pid).is_none_or(|s| s.sid != pid) {
        assert!(Instant::now() < end, "no session of its own");
        std::thread::sleep(Duration::from_millis(5));
    }
    c
}

fn term(pgid: u32, epoch: u64) -> TermRegistration {
    TermRegistration {
        path: "/LEADER".into(),
        epoch,
        who: "a".into(),
        host: "h".into(),
        // No elector process: the daemon stops the tree at once.
        pid: u32::MAX,
        pgid,
        cgroup: None,
    }
}

fn is_term_over<T: std::fmt::Debug>(r: FsResult<T>) -> bool {
    matches!(r, Err(FsError::TermOver { .. }))
}

/// Whether a control request of process `who` (as root) was refused
/// because its term is over.
fn control(c: &Arc<Core>, who: Caller, req: serde_json::Value) -> bool {
    let peer = super::Peer {
        pid: who.pid,
        uid: 0,
        gid: 0,
        groups: Vec::new(),
    };
    let admin =
        crate::dnadmin::Admin::new(c.clone(), Arc::new(crate::housekeeping::Housekeeper::new()));
    let a = super::requests::answer(
        c,
        &admin,
        std::path::Path::new("/mnt"),
        &peer,
        &req,
        &|| false,
    );
    a["error"]
        .as_str()
        .is_some_and(|e| e.starts_with("permission denied: the election term"))
}

/// One sweep kills the ended term's tree (`cmd`'s group); the next one
/// finds it gone and forgets its durable fence record.
fn sweep_kills_and_forgets(s: &TestFs, c: &Arc<Core>, cmd: &mut Child) {
    c.fences().sweep();
    let st = cmd.wait().expect("reaped");
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&st),
        Some(libc::SIGKILL)
    );
    c.fences().sweep();
    assert!(
        s.meta
            .fences(c.fences().owner())
            .expect("fences")
            .is_empty()
    );
}

#[test]
fn every_change_by_an_ended_terms_tree_is_refused_and_the_tree_stopped() {
    let s = TestFs::new(MountOptions::default(), 1);
    let c = s.core.clone();
    let me = caller(std::process::id());
    let leader = c
        .mknode(ROOT_INO, b"LEADER", file(Kind::File), me)
        .expect("LEADER");
    let f = c.mknode(ROOT_INO, b"f", file(Kind::File), me).expect("f");
    let lfh = open(&c, leader.ino, libc::O_WRONLY, me).expect("lead");
    let epoch = c.last_epoch(leader.ino).expect("epoch");
    let mut cmd = command();
    let pgid = cmd.id();
    c.fences()
        .register(leader.ino, &term(pgid, epoch), 0)
        .expect("fence");
    let it = caller(pgid);

    // During the term the command may do anything.
    let ffh = open(&c, f.ino, libc::O_WRONLY | libc::O_APPEND, it).expect("open f");
    assert_eq!(
        wait(|r| c.write(ffh, 0, b"a\n", (it, false), r)).expect("write"),
        2
    );
    c.mknode(ROOT_INO, b"d", file(Kind::Dir), it)
        .expect("mkdir");

    // The term ends: the election file's lease is released.
    wait(|r| c.release(lfh, r)).expect("release");
    let refused = [
        (
            "mkdir",
            is_term_over(c.mknode(ROOT_INO, b"d2", file(Kind::Dir), it)),
        ),
        ("unlink", is_term_over(c.unlink(ROOT_INO, b"f", it))),
        ("rmdir", is_term_over(c.rmdir(ROOT_INO, b"d", it))),
        (
            "rename",
            is_term_over(c.rename(ROOT_INO, b"f", ROOT_INO, b"g", 0, it)),
        ),
        ("link", is_term_over(c.link(f.ino, ROOT_INO, b"h", it))),
        (
            "setxattr",
            is_term_over(c.setxattr(f.ino, b"user.x", b"1", 0, it)),
        ),
        (
            "removexattr",
            is_term_over(c.removexattr(f.ino, b"user.x", it)),
        ),
        (
            "chmod",
            is_term_over(c.set_attrs(
                f.ino,
                AttrChange {
                    mode: Some(0o600),
                    ..Default::default()
                },
                it,
            )),
        ),
        (
            "truncate",
            is_term_over(wait(|r| c.set_size(f.ino, 0, None, it, r))),
        ),
        ("open", is_term_over(open(&c, f.ino, libc::O_WRONLY, it))),
        (
            "write",
            is_term_over(wait(|r| c.write(ffh, 2, b"b\n", (it, false), r))),
        ),
        (
            "ioctl",
            is_term_over(c.ioctl(ffh, crate::fs::core::IOC_RENEW)),
        ),
        // The control socket's changes, root's included: above all,
        // the tree may not drop its own fence.
        (
            "control unfence",
            control(&c, it, serde_json::json!({"op": "unfence", "pgid": pgid})),
        ),
        (
            "control recover",
            control(&c, it, serde_json::json!({"op": "recover", "path": "/f"})),
        ),
        (
            "control fsck repair",
            control(&c, it, serde_json::json!({"op": "fsck", "repair": true})),
        ),
        (
            "control datanode balance",
            control(
                &c,
                it,
                serde_json::json!({"op": "datanode_balance", "threshold": 10.0}),
            ),
        ),
    ];
    let let_through: Vec<&str> = refused.iter().filter(|r| !r.1).map(|r| r.0).collect();
    assert!(let_through.is_empty(), "not refused: {let_through:?}");
    assert!(
        c.fences().election_of(pgid).is_some(),
        "the fence was dropped"
    );
    // Anyone else is not fenced; reading is never refused.
    c.mknode(ROOT_INO, b"mine", file(Kind::File), me)
        .expect("others may");
    assert!(c.lookup(ROOT_INO, b"f").is_ok());

    // The sweep kills what is left of the tree, then forgets it.
    sweep_kills_and_forgets(&s, &c, &mut cmd);
    assert!(c.fences().is_empty());
}

#[test]
fn a_restarted_daemon_inherits_the_fences_and_pid_reuse_is_not_fenced() {
    let mut s = TestFs::new(MountOptions::default(), 1);
    let mut cmd = command();
    let pgid = cmd.id();
    {
        let c = s.core.clone();
        let me = caller(std::process::id());
        let leader = c
            .mknode(ROOT_INO, b"LEADER", file(Kind::File), me)
            .expect("LEADER");
        let _lfh = open(&c, leader.ino, libc::O_WRONLY, me).expect("lead");
        let epoch = c.last_epoch(leader.ino).expect("epoch");
        c.fences()
            .register(leader.ino, &term(pgid, epoch), 0)
            .expect("fence");
        c.mknode(ROOT_INO, b"during", file(Kind::Dir), caller(pgid))
            .expect("during the term");
        // A record of a tree that is gone (its number may be anyone's
        // now), and one from another boot.
        for (pg, boot) in [(pgid + 1_000_000, "this"), (std::process::id(), "other")] {
            let mut rec = s.meta.fences(c.fences().owner()).expect("fences")[0].clone();
            rec.pgid = pg;
            if boot == "other" {
                rec.boot_id = "another boot".into();
            }
            s.meta.put_fence(&rec).expect("put");
        }
        // The daemon dies with the lease held: no release, no sweep.
    }
    let c = s.restart();
    assert_eq!(c.fences().load().expect("load"), 1);
    assert!(is_term_over(c.mknode(
        ROOT_INO,
        b"after",
        file(Kind::Dir),
        caller(pgid)
    )));
    // This process's own number was in the other boot's record: not fenced.
    let me = caller(std::process::id());
    c.mknode(ROOT_INO, b"mine", file(Kind::Dir), me)
        .expect("not fenced");
    sweep_kills_and_forgets(&s, &c, &mut cmd);
}

/// A client that hung up (killed, interrupted) is seen as gone; one that
/// waits, or only shut its writing side, is not.
#[test]
fn a_client_that_hangs_up_is_gone_one_that_waits_is_not() {
    let (a, b) = std::os::unix::net::UnixStream::pair().expect("pair");
    assert!(!super::hung_up(&a));
    b.shutdown(std::net::Shutdown::Write).expect("shutdown");
    assert!(!super::hung_up(&a), "a half-closed client still waits");
    drop(b);
    assert!(super::hung_up(&a));
}

/// A deep fsck whose client went away stops before its next block
/// instead of reading every replica for nobody.
#[test]
fn a_deep_fsck_stops_when_its_client_is_gone() {
    let s = TestFs::new(MountOptions::default(), 1);
    let c = s.core.clone();
    let ino = s.create("f");
    let fh = s
        .open(ino, libc::O_WRONLY, crate::fs::testing::me())
        .expect("open");
    s.write(fh, 0, b"some data").expect("write");
    s.close(fh).expect("close");
    let root = super::Peer {
        pid: std::process::id(),
        uid: 0,
        gid: 0,
        groups: Vec::new(),
    };
    let admin =
        crate::dnadmin::Admin::new(c.clone(), Arc::new(crate::housekeeping::Housekeeper::new()));
    let ask = |gone: &dyn Fn() -> bool| {
        let req = serde_json::json!({"op": "fsck"});
        super::requests::answer(&c, &admin, std::path::Path::new("/mnt"), &root, &req, gone)
    };
    let a = ask(&|| false);
    assert_eq!(a["report"]["blocks"], 1, "{a}");
    let a = ask(&|| true);
    assert_eq!(a["error"], crate::fsck::CANCELLED, "{a}");
}
