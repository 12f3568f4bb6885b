//! Panic containment (docs/SEMANTICS.md, "The daemon"), with panics
//! injected through the daemon's test-only `LEASEFS_TEST_PANIC` variable
//! (see `src/fault.rs`): a panic costs its request `EIO` and the mount
//! serves on; a panic in a stream worker fails that stream's waiters
//! instead of leaving them hanging; a background thread that dies takes
//! the daemon down, logged and with a non-zero exit.

mod common;
use common::*;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// `stat PATH` in a child process bounded by `timeout`: (exit code, stderr).
fn stat(p: &Path) -> (Option<i32>, String) {
    let o = Command::new("timeout")
        .arg("10")
        .arg("stat")
        .arg(p)
        .output()
        .expect("run stat");
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn a_panic_in_a_request_fails_that_request_with_eio_and_the_mount_serves_on() {
    let m = Mount::with_env(Opts::default(), &[("LEASEFS_TEST_PANIC", "request")]);
    // More panics than the daemon has request threads.
    for i in 0..10 {
        let (code, err) = stat(&m.path("leasefs-test-panic"));
        assert_eq!(code, Some(1), "stat #{i} did not fail at once: {err}");
        assert!(err.contains("Input/output error"), "stat #{i}: {err}");
    }
    m.sh_ok("echo still > alive && mkdir d && mv alive d/");
    assert_eq!(m.read_string("d/alive"), "still\n");
    assert!(m.log().contains("request failed with EIO: it panicked"));
}

#[test]
fn a_panic_in_a_stream_worker_fails_its_waiters_instead_of_leaving_them_hanging() {
    let m = Mount::with_env(Opts::default(), &[("LEASEFS_TEST_PANIC", "stream")]);
    let mut w = Agent::spawn(&m.mnt);
    w.ok("open f wc");
    w.ok("write leasefs-test-panic: the packet that trips the worker");
    let r = w.cmd("fsync");
    assert_eq!(err_name(&r), Some("EIO"), "fsync: {r}");
    // Every later wait on that stream ends, with the same error.
    let r = w.cmd("fsync");
    assert_eq!(err_name(&r), Some("EIO"), "second fsync: {r}");
    let r = w.cmd("close");
    assert_eq!(err_name(&r), Some("EIO"), "close: {r}");
    // The file is closed by recovery and can be written again.
    let mut w2 = Agent::spawn(&m.mnt);
    assert!(
        wait_until(Duration::from_secs(10), || w2
            .cmd("open f wa")
            .starts_with("ok")),
        "the file never became writable again"
    );
    w2.ok("write fine");
    w2.ok("close");
    assert!(m.read_string("f").ends_with("fine\n"));
}

/// A daemon run in the foreground by the test, so that its exit status
/// can be seen; killed (this pid only) and its mount cleared on drop.
struct Foreground {
    child: Child,
    mnt: PathBuf,
    _dir: tempfile::TempDir,
}

impl Foreground {
    fn start(point: &str, o: &str) -> Foreground {
        let dir = tempfile::tempdir().expect("tempdir");
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).expect("mkdir");
        let child = Command::new(bin())
            .arg("mount")
            .arg(&mnt)
            .arg("--data")
            .arg(dir.path().join("data"))
            .args(["-o", o, "-f"])
            .env("LEASEFS_TEST_PANIC", point)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("log")).expect("log"))
            .spawn()
            .expect("spawn leasefs mount -f");
        let f = Foreground {
            child,
            mnt,
            _dir: dir,
        };
        assert!(
            wait_until(Duration::from_secs(20), || is_mounted(&f.mnt)),
            "never mounted"
        );
        f
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("log")).unwrap_or_default()
    }

    fn exit(&mut self, max: Duration) -> Option<std::process::ExitStatus> {
        let mut st = None;
        wait_until(max, || {
            st = self.child.try_wait().ok().flatten();
            st.is_some()
        });
        st
    }
}

impl Drop for Foreground {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            kill(self.child.id(), libc::SIGKILL);
        }
        let _ = self.child.wait();
        let _ = Command::new("fusermount3")
            .arg("-uz")
            .arg(&self.mnt)
            .output();
    }
}

#[test]
fn a_background_thread_that_dies_takes_the_daemon_down_loudly() {
    // Nothing open: a clean unmount, then a non-zero exit.
    let mut d = Foreground::start("monitor", "monitor_interval=0.2");
    std::fs::write(d.mnt.join("leasefs-test-panic"), b"").expect("create the trigger");
    let st = d
        .exit(Duration::from_secs(30))
        .expect("the daemon ran on without its monitor");
    assert_ne!(st.code(), Some(0), "exit status {st:?}");
    assert!(!is_mounted(&d.mnt), "still mounted");
    let log = d.log();
    assert!(
        log.contains("lease-monitor") && log.contains("background thread died"),
        "{log}"
    );

    // A file open: the mount cannot be unmounted cleanly, so it is detached
    // and the daemon exits at once (EX_SOFTWARE), as a crash would.
    let mut d = Foreground::start("renewer", "soft_limit=1");
    let mut w = Agent::spawn(&d.mnt);
    w.ok("open held wc");
    std::fs::write(d.mnt.join("leasefs-test-panic"), b"").expect("create the trigger");
    let st = d
        .exit(Duration::from_secs(30))
        .expect("the daemon ran on without its renewer");
    assert_eq!(st.code(), Some(70), "exit status {st:?}");
    assert!(!is_mounted(&d.mnt), "the dead mount was left behind");
    assert!(d.log().contains("lease-renewer"), "{}", d.log());
}
