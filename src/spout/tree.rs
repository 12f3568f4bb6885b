//! Killing an `--exec` command with everything it started: its process
//! group (it runs in its own), and any descendant that left the group
//! (`setsid`, a daemonizing helper), found through `/proc` before anything
//! is killed: once a parent dies its children are re-parented and can no
//! longer be told apart.

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

/// Parent pid of every process, from `/proc/PID/stat`.
fn parents() -> Vec<(i32, i32)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            // `pid (comm) state ppid ...`: comm may hold spaces and parens.
            let rest = &stat[stat.rfind(')')? + 1..];
            let ppid: i32 = rest.split_whitespace().nth(1)?.parse().ok()?;
            Some((pid, ppid))
        })
        .collect()
}

/// Every descendant of `root` (not `root` itself).
pub fn descendants(root: i32) -> Vec<i32> {
    let all = parents();
    let mut out = Vec::new();
    let mut frontier = vec![root];
    while let Some(p) = frontier.pop() {
        for &(pid, ppid) in &all {
            if ppid == p && !out.contains(&pid) {
                out.push(pid);
                frontier.push(pid);
            }
        }
    }
    out
}

/// Kills `root` (the leader of its own process group), its group and every
/// descendant with SIGKILL. The descendants are stopped first, so none
/// forks a new one between the listing and the kill. The caller reaps
/// `root`.
pub fn kill_tree(root: u32) {
    let Ok(root) = i32::try_from(root) else {
        return;
    };
    let _ = kill(Pid::from_raw(root), Signal::SIGSTOP);
    let kids = descendants(root);
    for &k in &kids {
        let _ = kill(Pid::from_raw(k), Signal::SIGSTOP);
    }
    let _ = killpg(Pid::from_raw(root), Signal::SIGKILL);
    let _ = kill(Pid::from_raw(root), Signal::SIGKILL);
    for k in kids {
        let _ = kill(Pid::from_raw(k), Signal::SIGKILL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;
    use std::time::{Duration, Instant};

    #[test]
    fn kills_descendants_that_left_the_group() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("pid");
        let mut c = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "setsid sh -c 'echo $$ > {}; sleep 600' & sleep 600",
                pidfile.display()
            ))
            .process_group(0)
            .spawn()
            .unwrap();
        let end = Instant::now() + Duration::from_secs(10);
        let escaped: i32 = loop {
            if let Some(p) = std::fs::read_to_string(&pidfile)
                .ok()
                .and_then(|s| s.trim().parse().ok())
            {
                break p;
            }
            assert!(Instant::now() < end, "setsid child never started");
            std::thread::sleep(Duration::from_millis(10));
        };
        kill_tree(c.id());
        c.wait().unwrap();
        let end = Instant::now() + Duration::from_secs(10);
        while std::path::Path::new(&format!("/proc/{escaped}")).exists()
            && std::fs::read_to_string(format!("/proc/{escaped}/stat"))
                .is_ok_and(|s| !s.contains(") Z"))
        {
            assert!(Instant::now() < end, "the setsid descendant survived");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}
