//! A throwaway single-member etcd on loopback, for the tests of the etcd
//! backends. It runs /usr/bin/etcd (CI installs it; a missing binary fails
//! the test rather than skipping it) with its data in a temporary directory
//! (under /dev/shm when there is one, since etcd fsyncs every commit), and
//! is killed, by its own pid, on drop.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use leasefs::etcd::Etcd;

pub const ETCD_BIN: &str = "/usr/bin/etcd";

pub struct EtcdServer {
    child: Child,
    dir: tempfile::TempDir,
    endpoint: String,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free loopback port")
}

impl EtcdServer {
    /// Starts etcd and waits (at most ~10 s) until it answers.
    pub fn start() -> EtcdServer {
        assert!(
            Path::new(ETCD_BIN).exists(),
            "{ETCD_BIN} is missing: the etcd tests need etcd 3.4+ (apt-get install etcd-server)"
        );
        // A port picked free may be taken before etcd binds it: try anew.
        let mut last = String::new();
        for _ in 0..3 {
            match Self::try_start() {
                Ok(s) => return s,
                Err(e) => last = e,
            }
        }
        panic!("etcd did not start: {last}");
    }

    fn try_start() -> Result<EtcdServer, String> {
        let dir = if Path::new("/dev/shm").is_dir() {
            tempfile::Builder::new()
                .prefix("leasefs-etcd")
                .tempdir_in("/dev/shm")
        } else {
            tempfile::tempdir()
        }
        .map_err(|e| format!("cannot make a data directory: {e}"))?;
        let (client, peer) = (free_port(), free_port());
        let curl = format!("http://127.0.0.1:{client}");
        let purl = format!("http://127.0.0.1:{peer}");
        let log = std::fs::File::create(dir.path().join("etcd.log"))
            .map_err(|e| format!("cannot create the etcd log: {e}"))?;
        let log2 = log.try_clone().map_err(|e| e.to_string())?;
        let child = Command::new(ETCD_BIN)
            .arg("--name")
            .arg("leasefs-test")
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .args(["--listen-client-urls", &curl])
            .args(["--advertise-client-urls", &curl])
            .args(["--listen-peer-urls", &purl])
            .args(["--initial-advertise-peer-urls", &purl])
            .args(["--initial-cluster", &format!("leasefs-test={purl}")])
            .args(["--initial-cluster-state", "new"])
            .args(["--logger", "zap", "--log-level", "warn"])
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .spawn()
            .map_err(|e| format!("cannot run {ETCD_BIN}: {e}"))?;
        let mut s = EtcdServer {
            child,
            dir,
            endpoint: format!("127.0.0.1:{client}"),
        };
        let mut exited = None;
        let up = super::poll_until(Duration::from_secs(10), Duration::from_millis(100), || {
            exited = s.child.try_wait().ok().flatten();
            exited.is_some() || Etcd::connect(&[s.endpoint.clone()], "probe").is_ok()
        });
        match exited {
            Some(st) => Err(format!("etcd exited ({st}): {}", s.log())),
            None if up => Ok(s),
            None => Err(format!("etcd did not answer in 10 s: {}", s.log())),
        }
    }

    /// One etcd per test process, shared by the tests running at the same
    /// time and killed when the last of them drops it.
    pub fn shared() -> Arc<EtcdServer> {
        static SHARED: Mutex<Weak<EtcdServer>> = Mutex::new(Weak::new());
        let mut g = SHARED.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = g.upgrade() {
            return s;
        }
        let s = Arc::new(EtcdServer::start());
        *g = Arc::downgrade(&s);
        s
    }

    /// `127.0.0.1:PORT` of the client URL.
    pub fn endpoint(&self) -> String {
        self.endpoint.clone()
    }

    /// A connection under a filesystem name no other test uses.
    pub fn connect(&self, test: &str) -> (Arc<Etcd>, String) {
        static N: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            "{test}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        (self.connect_to(&name), name)
    }

    /// Another connection to the filesystem `name`, as a second daemon has.
    pub fn connect_to(&self, name: &str) -> Arc<Etcd> {
        Arc::new(Etcd::connect(&[self.endpoint()], name).expect("cannot connect to the test etcd"))
    }

    /// The etcd process's pid: a test may SIGSTOP it to cut every daemon
    /// off (and must SIGCONT it again, whatever happens).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default()
    }

    /// How many keys start with `prefix` (e.g. the writers queued for a
    /// file), asked through etcd's JSON gateway with `curl`: from outside
    /// the daemons, as an operator would.
    pub fn count_keys(&self, prefix: &str) -> u64 {
        let mut end = prefix.as_bytes().to_vec();
        if let Some(last) = end.last_mut() {
            *last += 1;
        }
        let body = serde_json::json!({
            "key": base64(prefix.as_bytes()),
            "range_end": base64(&end),
            "count_only": true,
        });
        let o = Command::new("curl")
            .args(["-sS", "--max-time", "10", "-X", "POST", "-d"])
            .arg(body.to_string())
            .arg(format!("http://{}/v3/kv/range", self.endpoint))
            .output()
            .expect("run curl (apt package curl)");
        assert!(
            o.status.success(),
            "etcd range request: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("etcd's JSON answer");
        // A count of 0 is left out; counts are strings (int64 in JSON).
        v["count"]
            .as_str()
            .map_or(0, |c| c.parse().expect("a count"))
    }
}

/// Standard base64 with padding, as etcd's gateway takes keys.
fn base64(b: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut s = String::new();
    for c in b.chunks(3) {
        let n = (c[0] as u32) << 16
            | (*c.get(1).unwrap_or(&0) as u32) << 8
            | *c.get(2).unwrap_or(&0) as u32;
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            s.push(if i <= c.len() {
                A[(n >> shift & 63) as usize] as char
            } else {
                '='
            });
        }
    }
    s
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        // Child::kill signals exactly this child's pid.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A daemon of the shared filesystem `prefix` over `etcd`, on the
/// datanode directories `dns` (the same for every daemon of it).
pub fn daemon(etcd: &EtcdServer, prefix: &str, dns: &[PathBuf], o: &[&str]) -> super::Mount {
    super::Mount::with_datanode_paths(
        super::Opts {
            o: o.iter().map(|s| s.to_string()).collect(),
            args: vec![
                "--meta".into(),
                format!("etcd://{}", etcd.endpoint()),
                "--prefix".into(),
                prefix.into(),
            ],
            ..super::Opts::default()
        },
        dns.to_vec(),
    )
}

/// As [`daemon`], reaching etcd at `endpoint` (a proxy) and with `env`
/// added to the daemon's environment.
pub fn daemon_at(
    endpoint: &str,
    prefix: &str,
    dns: &[PathBuf],
    o: &[&str],
    env: &[(&str, &str)],
) -> super::Mount {
    super::Mount::with_datanode_paths_env(
        super::Opts {
            o: o.iter().map(|s| s.to_string()).collect(),
            args: vec![
                "--meta".into(),
                format!("etcd://{endpoint}"),
                "--prefix".into(),
                prefix.into(),
            ],
            ..super::Opts::default()
        },
        dns.to_vec(),
        env,
    )
}

/// Three datanode directories in `dir`, for daemons to share.
pub fn shared_datanodes(dir: &tempfile::TempDir) -> Vec<PathBuf> {
    (1..=3).map(|i| dir.path().join(format!("dn{i}"))).collect()
}

impl EtcdServer {
    /// The claim of file `ino` in the filesystem `prefix` (its JSON value),
    /// as etcd holds it.
    pub fn claim(&self, prefix: &str, ino: u64) -> Option<serde_json::Value> {
        let etcd = self.connect_to(prefix);
        let key = etcd.key(&format!("lease/{ino:016x}"));
        let r = etcd
            .run(|mut c| async move { c.get(key, None).await })
            .expect("read a claim");
        let kv = r.kvs().first()?;
        Some(serde_json::from_slice(kv.value()).expect("a claim's JSON"))
    }

    /// Revokes the etcd lease of `ino`'s claim behind its daemon's back,
    /// as `etcdctl lease revoke` would; returns the lease's id.
    pub fn revoke_claim(&self, prefix: &str, ino: u64) -> i64 {
        let claim = self
            .claim(prefix, ino)
            .unwrap_or_else(|| panic!("file {ino} is not claimed"));
        let id = claim["lease_id"].as_i64().expect("the claim's lease id");
        let etcd = self.connect_to(prefix);
        etcd.run(|mut c| async move { c.lease_revoke(id).await })
            .expect("revoke the claim's lease");
        id
    }

    /// [`EtcdServer::revoke_claim`] of a claim that may come and go
    /// meanwhile (its writer opens and closes the file): `None` when there
    /// was none, or its lease ended between the read and the revoke.
    pub fn try_revoke_claim(&self, prefix: &str, ino: u64) -> Option<i64> {
        let id = self.claim(prefix, ino)?["lease_id"]
            .as_i64()
            .expect("the claim's lease id");
        let etcd = self.connect_to(prefix);
        match etcd.run(|mut c| async move { c.lease_revoke(id).await }) {
            Ok(_) => Some(id),
            Err(e) if e.to_string().contains("lease not found") => None,
            Err(e) => panic!("revoke the claim's lease: {e}"),
        }
    }
}
