//! `testkit proxy` (tools/testkit/src/proxy.rs) between one daemon and a
//! TCP service it needs (etcd, an S3 endpoint): the way a test takes a
//! daemon's network away without touching the service or the other
//! daemons. `pause` stops delivering (connections stay open, the bytes
//! wait), `cut` resets every connection and every new one; `resume` and
//! `heal` undo them. The proxy is killed, by its own pid, on drop.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use super::testkit;

pub struct Proxy {
    child: Child,
    stdin: ChildStdin,
    out: BufReader<ChildStdout>,
    port: u16,
}

impl Proxy {
    /// A proxy to `target` (`HOST:PORT`), listening on a free loopback port.
    pub fn start(target: &str) -> Proxy {
        let mut child = Command::new(testkit())
            .args(["proxy", target])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn testkit proxy");
        let stdin = child.stdin.take().expect("stdin");
        let mut out = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        out.read_line(&mut line).expect("proxy's first line");
        let port = line
            .trim()
            .strip_prefix("listening ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("proxy said {line:?}"));
        Proxy {
            child,
            stdin,
            out,
            port,
        }
    }

    /// `127.0.0.1:PORT`, what the daemon is given instead of the service.
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `pause`, `resume`, `cut` or `heal`, in force when this returns.
    pub fn send(&mut self, cmd: &str) {
        if let Err(e) = self.try_send(cmd) {
            panic!("proxy: {cmd}: {e}");
        }
    }

    /// As [`Proxy::send`], reporting a failure instead of panicking: for
    /// restoring the connection on the way out of a failed test.
    pub fn try_send(&mut self, cmd: &str) -> Result<(), String> {
        writeln!(self.stdin, "{cmd}").map_err(|e| format!("write to the proxy: {e}"))?;
        let mut line = String::new();
        self.out
            .read_line(&mut line)
            .map_err(|e| format!("the proxy's answer: {e}"))?;
        if line.trim() == "ok" {
            Ok(())
        } else {
            Err(format!("proxy answered {line:?}"))
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        // Child::kill signals exactly this child's pid.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
