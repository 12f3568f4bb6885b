//! A `leasefs elect` candidate the tests drive, shared by the single-mount
//! and the multi-daemon election tests.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

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
        if self.status.is_none() {
            wait_until(max, || {
                self.status = self.child.try_wait().ok().flatten();
                self.status.is_some()
            });
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
            // Its command's tree first: once the elector is gone, only its
            // daemon would stop what is left of it, and the test may have
            // failed because that daemon is gone.
            for child in children_of(self.pid()) {
                for pid in session_of(child) {
                    kill(pid, libc::SIGKILL);
                }
            }
            kill(self.pid(), libc::SIGCONT);
            kill(self.pid(), libc::SIGKILL);
        }
        let _ = self.child.wait();
    }
}

/// (pid, ppid, session) of every process.
fn processes() -> Vec<(u32, u32, u32)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let (_, rest) = stat.rsplit_once(')')?;
            let f: Vec<&str> = rest.split_whitespace().collect();
            Some((pid, f.get(1)?.parse().ok()?, f.get(3)?.parse().ok()?))
        })
        .collect()
}

fn children_of(parent: u32) -> Vec<u32> {
    processes()
        .into_iter()
        .filter(|p| p.1 == parent)
        .map(|p| p.0)
        .collect()
}

/// The processes of session `sid` (only if `sid` leads one).
fn session_of(sid: u32) -> Vec<u32> {
    processes()
        .into_iter()
        .filter(|p| p.2 == sid)
        .map(|p| p.0)
        .collect()
}

/// Whether any process of group (or session) `pgid` is alive and not a
/// zombie: a command whose stopped elector cannot reap it is gone once
/// only its zombie is left.
pub fn group_alive(pgid: u32) -> bool {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return false;
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .any(|pid| {
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                return false;
            };
            let Some((_, rest)) = stat.rsplit_once(')') else {
                return false;
            };
            let f: Vec<&str> = rest.split_whitespace().collect();
            f.first() != Some(&"Z")
                && (f.get(2) == Some(&pgid.to_string().as_str())
                    || f.get(3) == Some(&pgid.to_string().as_str()))
        })
}

/// The election's audit table (every event kept), through `leasefs elect
/// DIR --history --all --json` (over etcd the same through every daemon).
pub fn history(m: &Mount, dir: &str) -> Vec<serde_json::Value> {
    let dir = m.path(dir);
    if !dir.exists() {
        return Vec::new(); // no elector has created it yet
    }
    let out = m.leasefs(&[
        "elect",
        dir.to_str().expect("utf-8 path"),
        "--history",
        "--all",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "--history failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice::<Vec<serde_json::Value>>(&out.stdout).expect("history JSON")
}

pub fn events<'a>(h: &'a [serde_json::Value], kind: &str) -> Vec<&'a serde_json::Value> {
    h.iter().filter(|e| e["event"] == kind).collect()
}

/// An audit event that ends a term.
pub fn is_end(e: &serde_json::Value) -> bool {
    matches!(
        e["event"].as_str(),
        Some("resigned" | "lost" | "expired" | "preempted")
    )
}

/// The journal's complete lines as (epoch, id). Read again on an error: a
/// read that races with an append reopening the file can fail with EIO
/// (a daemon bug, reported), and a line being written may show in part.
pub fn journal(m: &Mount) -> Vec<(u64, String)> {
    journal_at(m, "journal")
}

/// [`journal`] at another path of the mount.
pub fn journal_at(m: &Mount, rel: &str) -> Vec<(u64, String)> {
    let mut text = String::new();
    let mut failed = None;
    let read = wait_until(Duration::from_secs(1), || {
        match std::fs::read(m.path(rel)) {
            Ok(b) => {
                text = String::from_utf8_lossy(&b).into_owned();
                true
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
            Err(e) => {
                eprintln!("journal read failed ({e}); reading again");
                failed = Some(e);
                false
            }
        }
    });
    if !read {
        panic!("cannot read the journal: {failed:?}");
    }
    let complete = text.rfind('\n').map_or("", |end| &text[..end]);
    complete
        .lines()
        .filter_map(|l| {
            let (e, id) = l.split_once(' ')?;
            Some((e.parse().ok()?, id.to_string()))
        })
        .collect()
}

/// No two terms overlapped, by the audit table and by the journal.
pub fn check_terms(h: &[serde_json::Value], lines: &[(u64, String)]) {
    let elected = events(h, "elected");
    let mut by_epoch: HashMap<u64, String> = HashMap::new();
    let mut last = 0;
    for e in &elected {
        let epoch = e["epoch"].as_u64().expect("epoch");
        assert!(
            epoch > last,
            "elected epochs do not increase: {epoch} after {last}\n{h:#?}"
        );
        last = epoch;
        by_epoch.insert(epoch, e["who"].as_str().unwrap_or("").to_string());
    }
    // Every term's end is recorded before the next term's start.
    let pos = |pred: &dyn Fn(&serde_json::Value) -> bool| h.iter().position(pred);
    for pair in elected.windows(2) {
        let (e1, e2) = (pair[0]["epoch"].as_u64(), pair[1]["epoch"].as_u64());
        let next = pos(&|v| v["event"] == "elected" && v["epoch"].as_u64() == e2).expect("elected");
        let end = pos(&|v| is_end(v) && v["epoch"].as_u64() == e1);
        assert!(
            end.is_some_and(|i| i < next),
            "term {e1:?} has no end recorded before term {e2:?} began\n{h:#?}"
        );
    }
    let mut last = 0;
    let mut owner: HashMap<u64, &str> = HashMap::new();
    for (i, (epoch, id)) in lines.iter().enumerate() {
        assert!(
            *epoch >= last,
            "journal line {i}: epoch {epoch} after {last}"
        );
        last = *epoch;
        let o = owner.entry(*epoch).or_insert(id);
        assert_eq!(o, id, "journal epoch {epoch} written by two ids");
        assert_eq!(
            by_epoch.get(epoch).map(String::as_str),
            Some(id.as_str()),
            "journal line {i} ({epoch} {id}) matches no elected event"
        );
    }
}
