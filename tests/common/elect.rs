//! A `leasefs elect` candidate the tests drive, shared by the single-mount
//! and the multi-daemon election tests.

use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::*;

/// One `leasefs elect` process; its stderr goes to a file outside the
/// mount. Killed (only this pid; its command dies with it) if the test
/// fails before it exits.
pub struct Candidate {
    pub id: String,
    pub child: Child,
    pub log: PathBuf,
    pub status: Option<ExitStatus>,
}

impl Candidate {
    pub fn spawn(m: &Mount, dir: &str, id: &str, opts: &[&str], command: &[&str]) -> Candidate {
        let log = m.dir.path().join(format!("elect-{id}.log"));
        let mut c = Command::new(bin());
        c.arg("elect")
            .arg(m.path(dir))
            .args(["--id", id])
            .args(opts);
        if !opts.contains(&"--retry-ms") {
            c.args(["--retry-ms", "100"]);
        }
        if !command.is_empty() {
            c.arg("--").args(command);
        }
        let child = c
            .current_dir(&m.mnt)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("elector log"))
            .spawn()
            .expect("spawn leasefs elect");
        Candidate {
            id: id.to_string(),
            child,
            log,
            status: None,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn signal(&self, sig: i32) {
        kill(self.pid(), sig);
    }

    pub fn wait(&mut self, max: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + max;
        while self.status.is_none() {
            if let Ok(Some(st)) = self.child.try_wait() {
                self.status = Some(st);
                break;
            }
            if Instant::now() > deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.status
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Candidate {
    fn drop(&mut self) {
        if self.status.is_none() && matches!(self.child.try_wait(), Ok(None)) {
            kill(self.pid(), libc::SIGCONT);
            kill(self.pid(), libc::SIGKILL);
        }
        let _ = self.child.wait();
    }
}
