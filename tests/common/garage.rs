//! A real S3 object store for the tests: three Garage nodes on loopback
//! with replication factor 3, started by `mount-scripts/garage.sh up` in a
//! temporary directory and stopped by `garage.sh down --purge` on drop
//! (the script kills only the pids it recorded). Garage is not installed
//! by CI yet, so [`Garage::installed`] lets a test skip itself; S3
//! requests go through curl's own SigV4 signing, so no test code signs.

use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

pub struct Garage {
    dir: tempfile::TempDir,
    /// `http://127.0.0.1:PORT` of node 0's S3 API.
    pub endpoint: String,
    /// Each node's S3 API, node 0 first.
    pub endpoints: Vec<String>,
    pub bucket: String,
    pub region: String,
    pub access_key: String,
    pub secret_key: String,
    /// Each node's pid as `garage.sh up` recorded it.
    pub pids: Vec<u32>,
    /// How long `garage.sh up` took.
    pub startup: Duration,
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("mount-scripts/garage.sh")
}

/// A base port whose nine ports (BASE+10n+{0,1,3}, n<3) are free now, different
/// for each call so that tests running at once do not collide.
fn base_port() -> u16 {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let salt = (std::process::id() % 400) as u16;
    for _ in 0..50 {
        let k = NEXT.fetch_add(1, Ordering::Relaxed);
        let base = 20000 + ((salt + k * 37) % 400) * 100;
        let free = (0..3u16).all(|n| {
            [0u16, 1, 3]
                .iter()
                .all(|o| TcpListener::bind(("127.0.0.1", base + 10 * n + o)).is_ok())
        });
        if free {
            return base;
        }
    }
    panic!("no free range of loopback ports for Garage");
}

impl Garage {
    /// Whether `garage.sh path` finds a garage binary.
    pub fn installed() -> bool {
        Command::new(script())
            .arg("path")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    }

    /// Starts the cluster and waits (the script's own timeouts, 90 s per
    /// step) until S3 PUT and GET work on every node.
    pub fn start() -> Garage {
        let dir = tempfile::Builder::new()
            .prefix("leasefs-garage")
            .tempdir()
            .expect("cannot make a directory for Garage");
        let mut last = String::new();
        // A port found free may be taken before Garage binds it: try anew.
        for _ in 0..3 {
            let t0 = Instant::now();
            let out = Command::new(script())
                .arg("up")
                .arg(dir.path())
                .env("GARAGE_BASE_PORT", base_port().to_string())
                .stdin(Stdio::null())
                .output()
                .expect("cannot run mount-scripts/garage.sh");
            let startup = t0.elapsed();
            if out.status.success() {
                return Self::from_env(dir, startup);
            }
            last = String::from_utf8_lossy(&out.stderr).into_owned();
            Self::down(dir.path());
        }
        panic!("garage.sh up failed: {last}");
    }

    fn from_env(dir: tempfile::TempDir, startup: Duration) -> Garage {
        let text = std::fs::read_to_string(dir.path().join("env")).expect("garage.sh wrote no env");
        let var = |k: &str| -> String {
            text.lines()
                .find_map(|l| l.strip_prefix(k).and_then(|r| r.strip_prefix('=')))
                .unwrap_or_else(|| panic!("{k} missing from garage.sh's env"))
                .trim_matches('"')
                .to_string()
        };
        let pids = (0..3)
            .map(|n| {
                var(&format!("GARAGE_PID_{n}"))
                    .parse()
                    .expect("a pid in garage.sh's env")
            })
            .collect();
        Garage {
            endpoint: var("S3_ENDPOINT"),
            endpoints: (0..3).map(|n| var(&format!("S3_ENDPOINT_{n}"))).collect(),
            bucket: var("S3_BUCKET"),
            region: var("AWS_REGION"),
            access_key: var("AWS_ACCESS_KEY_ID"),
            secret_key: var("AWS_SECRET_ACCESS_KEY"),
            pids,
            startup,
            dir,
        }
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Kills node `n` with SIGKILL, by the pid recorded at start-up, after
    /// checking that this pid still runs garage with this cluster's config.
    pub fn kill_node(&self, n: usize) {
        let pid = self.pids[n];
        let conf = self.dir().join(format!("node{n}/garage.toml"));
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        assert!(
            cmdline.contains(&conf.display().to_string()),
            "pid {pid} is not garage node {n} any more: {cmdline:?}"
        );
        let p = nix::unistd::Pid::from_raw(pid as i32);
        nix::sys::signal::kill(p, nix::sys::signal::Signal::SIGKILL).expect("kill garage node");
        super::wait_for(Duration::from_secs(10), "the killed node to exit", || {
            std::fs::read(format!("/proc/{pid}/cmdline")).map_or(true, |c| c.is_empty())
        });
    }

    /// One signed S3 request with curl; the credentials go on curl's stdin
    /// (`-K -`), not on its command line.
    fn curl(
        &self,
        node: usize,
        method: &str,
        key: &str,
        body: Option<&[u8]>,
    ) -> Result<Vec<u8>, String> {
        let url = format!("{}/{}/{}", self.endpoints[node], self.bucket, key);
        let mut cfg = format!("user = \"{}:{}\"\n", self.access_key, self.secret_key);
        let body_file;
        if let Some(b) = body {
            body_file = self.dir().join("curl-body");
            std::fs::write(&body_file, b).map_err(|e| e.to_string())?;
            cfg.push_str(&format!("data-binary = \"@{}\"\n", body_file.display()));
        }
        let mut child = Command::new("curl")
            .args([
                "-sS",
                "--fail-with-body",
                "--max-time",
                "20",
                "-K",
                "-",
                "-X",
                method,
            ])
            .arg("--aws-sigv4")
            .arg(format!("aws:amz:{}:s3", self.region))
            .args(["-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD"])
            .arg(&url)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot run curl: {e}"))?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin.write_all(cfg.as_bytes()).map_err(|e| e.to_string())?;
        }
        let out = child.wait_with_output().map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(out.stdout)
        } else {
            Err(format!(
                "{method} {url}: {} {}",
                String::from_utf8_lossy(&out.stderr).trim(),
                String::from_utf8_lossy(&out.stdout).trim()
            ))
        }
    }

    /// The keys under `prefix` (one LIST of up to 1,000 keys).
    pub fn list(&self, node: usize, prefix: &str) -> Result<Vec<String>, String> {
        // SigV4 signs the query as sent: `/` must be percent-encoded.
        let q = prefix.replace('/', "%2F");
        let xml = self.curl(node, "GET", &format!("?list-type=2&prefix={q}"), None)?;
        let xml = String::from_utf8_lossy(&xml);
        Ok(xml
            .split("<Key>")
            .skip(1)
            .filter_map(|s| s.split("</Key>").next())
            .map(str::to_string)
            .collect())
    }

    pub fn put(&self, node: usize, key: &str, body: &[u8]) -> Result<(), String> {
        self.curl(node, "PUT", key, Some(body)).map(|_| ())
    }

    pub fn get(&self, node: usize, key: &str) -> Result<Vec<u8>, String> {
        self.curl(node, "GET", key, None)
    }

    /// The store's own client as the ceiling of a mount's figures: one
    /// curl process (one connection, as the daemon keeps) PUTs then GETs
    /// one object of `mib` MiB, then PUTs `n` objects of 4 KiB one after
    /// the other. Returns (write MB/s, read MB/s, 4 KiB PUT p50 ms, 4 KiB
    /// PUTs per second).
    pub fn client_figures(&self, mib: usize, n: usize) -> (f64, f64, f64, f64) {
        let big = self.dir().join("fig-big");
        let small = self.dir().join("fig-small");
        std::fs::write(&big, vec![7u8; mib << 20]).expect("write the big body");
        std::fs::write(&small, vec![7u8; 4096]).expect("write the small body");
        let base = format!("{}/{}", self.endpoints[0], self.bucket);
        let common = format!(
            "user = \"{}:{}\"\naws-sigv4 = \"aws:amz:{}:s3\"\nheader = \"x-amz-content-sha256: UNSIGNED-PAYLOAD\"\nsilent\nshow-error\nfail\nwrite-out = \"%{{time_total}}\\n\"\noutput = \"/dev/null\"\n",
            self.access_key, self.secret_key, self.region
        );
        let mut cfg = format!(
            "{common}upload-file = \"{}\"\nurl = \"{base}/fig/big\"\nnext\n{common}url = \"{base}/fig/big\"\n",
            big.display()
        );
        for i in 0..n {
            cfg.push_str(&format!(
                "next\n{common}upload-file = \"{}\"\nurl = \"{base}/fig/s{i}\"\n",
                small.display()
            ));
        }
        let mut child = Command::new("curl")
            .args(["-K", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("cannot run curl");
        child
            .stdin
            .take()
            .expect("curl's stdin")
            .write_all(cfg.as_bytes())
            .expect("write curl's config");
        let out = child.wait_with_output().expect("curl");
        assert!(
            out.status.success(),
            "curl: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let t: Vec<f64> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| l.trim().parse().expect("curl's time_total"))
            .collect();
        assert_eq!(t.len(), n + 2, "one time per transfer");
        let mut puts = t[2..].to_vec();
        let total: f64 = puts.iter().sum();
        puts.sort_by(f64::total_cmp);
        (
            mib as f64 / t[0],
            mib as f64 / t[1],
            puts[n / 2] * 1e3,
            n as f64 / total,
        )
    }

    fn down(dir: &Path) {
        let out = Command::new(script())
            .arg("down")
            .arg(dir)
            .arg("--purge")
            .stdin(Stdio::null())
            .output();
        match out {
            Ok(o) if o.status.success() => {}
            Ok(o) => eprintln!("garage.sh down: {}", String::from_utf8_lossy(&o.stderr)),
            Err(e) => eprintln!("cannot run garage.sh down: {e}"),
        }
    }
}

impl Drop for Garage {
    fn drop(&mut self) {
        Self::down(self.dir.path());
    }
}
