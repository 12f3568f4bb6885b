//! Helpers of the storage-fault tests (`tests/faults_*.rs`,
//! `tests/crash_rounds.rs`): a tmpfs and a read-only bind mount the test
//! mounts itself (always unmounted on drop, even when the test fails), the
//! block table read straight from the metadata store, replica files and
//! their checksums on disk, `leasefs fsck` runs, and a writer that copies a
//! known source file into the mount with fsyncs.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::*;

/// `n` pseudo-random bytes, the same for the same seed.
pub fn pattern(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

fn run(cmd: &str, args: &[&str]) -> std::process::Output {
    Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {cmd}: {e}"))
}

/// Unmounts `p`, lazily if it is busy; never panics (used from `Drop`).
fn umount_always(p: &Path) {
    let unmounted = poll_until(Duration::from_secs(2), Duration::from_millis(100), || {
        if is_mounted(p) {
            let _ = Command::new("umount").arg(p).output();
        }
        !is_mounted(p)
    });
    if !unmounted {
        let _ = Command::new("umount").arg("-l").arg(p).output();
    }
}

/// A tmpfs of a given size mounted by the test on a fresh directory,
/// unmounted when dropped (lazily if something still holds it).
pub struct Tmpfs {
    pub path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Tmpfs {
    /// `size` as tmpfs takes it: "8m".
    pub fn new(size: &str) -> Tmpfs {
        let dir = tempfile::Builder::new()
            .prefix("leasefs-tmpfs")
            .tempdir()
            .expect("tempdir");
        let path = dir.path().join("dn");
        std::fs::create_dir_all(&path).expect("mkdir tmpfs mountpoint");
        let o = run(
            "mount",
            &[
                "-t",
                "tmpfs",
                "-o",
                // 0755, not tmpfs's 1777: a datanode directory other
                // users may write is refused (SEMANTICS "The daemon").
                &format!("size={size},mode=0755"),
                "leasefs-test",
                &path.display().to_string(),
            ],
        );
        assert!(
            o.status.success(),
            "mount -t tmpfs -o size={size} failed: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        Tmpfs { path, _dir: dir }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        umount_always(&self.path);
    }
}

/// A read-only bind mount of a directory over itself: the directory stays
/// readable but every write in it fails with EROFS. Dropping it (or
/// [`RoBind::restore`]) makes the directory writable again.
pub struct RoBind {
    pub path: PathBuf,
    mounted: bool,
}

impl RoBind {
    pub fn new(path: &Path) -> RoBind {
        let p = path.display().to_string();
        let o = run("mount", &["--bind", &p, &p]);
        assert!(
            o.status.success(),
            "mount --bind {p}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        // From here on the guard unmounts, whatever fails next.
        let g = RoBind {
            path: path.to_path_buf(),
            mounted: true,
        };
        let o = run("mount", &["-o", "remount,bind,ro", &p]);
        assert!(
            o.status.success(),
            "mount -o remount,bind,ro {p}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        g
    }

    pub fn restore(&mut self) {
        if self.mounted {
            umount_always(&self.path);
            self.mounted = false;
        }
    }
}

impl Drop for RoBind {
    fn drop(&mut self) {
        self.restore();
    }
}

/// Held (shared) by every `drop_caches`, and alone by a test that needs
/// the page cache it filled to stay: the tests of one binary run on
/// threads of one process, and a sibling's `drop_caches` evicted the
/// replicas a read-from-memory test had just cached (failed so in CI).
static PAGE_CACHE: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// Keeps every other test of this binary from dropping the page cache
/// until the guard is dropped.
pub fn keep_page_cache() -> std::sync::RwLockWriteGuard<'static, ()> {
    PAGE_CACHE.write().unwrap_or_else(|e| e.into_inner())
}

/// Flushes dirty pages and drops the page cache, so the next read of a
/// file of the mount goes to the daemon (and so to a replica).
pub fn drop_caches() {
    let _shared = PAGE_CACHE.read().unwrap_or_else(|e| e.into_inner());
    let _ = Command::new("sync").output();
    let _ = std::fs::write("/proc/sys/vm/drop_caches", "3");
}

/// One row of the block table, read from `DATA/meta.db`. `replicas` are
/// datanode ids, which on a fresh mount are the places in its
/// `--datanode` list (`Mount::datanodes`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    pub ino: u64,
    pub idx: u64,
    pub id: u64,
    pub gs: u64,
    pub len: u64,
    pub finalized: bool,
    pub replicas: Vec<usize>,
}

/// Every block of the data directory (read-only; the daemon may run).
/// On the etcd backend, from etcd: the fixture names the filesystem after
/// the test's directory, the data directory's parent. A mount that chose
/// `--meta sqlite` itself (a fixture of SQLite data) has a `meta.db` even
/// in the etcd pass, and is read from it.
pub fn all_blocks(data: &Path) -> Vec<Block> {
    if super::etcd_backend() && !data.join("meta.db").exists() {
        use leasefs::meta::BlockMap;
        let name = data
            .parent()
            .and_then(|p| p.file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .expect("test directory name");
        let etcd = super::etcd::EtcdServer::shared().connect_to(&name);
        let meta = leasefs::meta::EtcdMeta::open(etcd, 0, 0).expect("open the etcd namespace");
        return meta
            .all_blocks()
            .expect("read blocks from etcd")
            .into_iter()
            .map(|b| Block {
                ino: b.ino,
                idx: b.idx,
                id: b.block_id,
                gs: b.gs,
                len: b.len,
                finalized: b.finalized,
                replicas: b.replicas.into_iter().map(|d| d.0 as usize).collect(),
            })
            .collect();
    }
    let db = rusqlite::Connection::open_with_flags(
        data.join("meta.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .expect("open meta.db read-only");
    db.busy_timeout(Duration::from_secs(5))
        .expect("busy timeout");
    let mut st = db
        .prepare(
            "SELECT ino, idx, block_id, gs, len, finalized, replicas FROM blocks ORDER BY ino, idx",
        )
        .expect("prepare");
    st.query_map([], |r| {
        let reps: String = r.get(6)?;
        Ok(Block {
            ino: r.get::<_, i64>(0)? as u64,
            idx: r.get::<_, i64>(1)? as u64,
            id: r.get::<_, i64>(2)? as u64,
            gs: r.get::<_, i64>(3)? as u64,
            len: r.get::<_, i64>(4)? as u64,
            finalized: r.get::<_, i64>(5)? != 0,
            replicas: reps.split(',').filter_map(|s| s.parse().ok()).collect(),
        })
    })
    .expect("query blocks")
    .collect::<Result<Vec<_>, _>>()
    .expect("read blocks")
}

/// The blocks of the file `rel` of the mount.
pub fn blocks_of(m: &Mount, rel: &str) -> Vec<Block> {
    use std::os::unix::fs::MetadataExt;
    let ino = std::fs::metadata(m.path(rel))
        .unwrap_or_else(|e| panic!("stat {rel}: {e}"))
        .ino();
    all_blocks(&m.data)
        .into_iter()
        .filter(|b| b.ino == ino)
        .collect()
}

/// The files of one replica found on a datanode.
#[derive(Debug, Clone)]
pub struct ReplicaFiles {
    pub data: PathBuf,
    pub meta: PathBuf,
    pub gs: u64,
    /// "rbw" or "finalized" (of the data file).
    pub state: &'static str,
}

/// The replica of `block` on datanode directory `dn`, if its data file and
/// a checksum file exist (the highest generation stamp when several do).
pub fn replica(dn: &Path, block: u64) -> Option<ReplicaFiles> {
    for state in ["rbw", "finalized"] {
        let dir = dn.join(state);
        let data = dir.join(format!("blk_{block}"));
        if !data.exists() {
            continue;
        }
        let prefix = format!("blk_{block}_");
        let mut best: Option<(u64, PathBuf)> = None;
        for d in ["rbw", "finalized"] {
            for e in std::fs::read_dir(dn.join(d))
                .into_iter()
                .flatten()
                .flatten()
            {
                let name = e.file_name().to_string_lossy().into_owned();
                let Some(gs) = name
                    .strip_prefix(&prefix)
                    .and_then(|r| r.strip_suffix(".meta"))
                    .and_then(|g| g.parse::<u64>().ok())
                else {
                    continue;
                };
                if best.as_ref().is_none_or(|(b, _)| gs > *b) {
                    best = Some((gs, e.path()));
                }
            }
        }
        let (gs, meta) = best?;
        return Some(ReplicaFiles {
            data,
            meta,
            gs,
            state,
        });
    }
    None
}

/// CRC32C of every 512-byte chunk, encoded as a checksum file is.
pub fn meta_bytes(data: &[u8]) -> Vec<u8> {
    let mut v = b"LFS1\x00\x01\x02\x09".to_vec();
    for c in data.chunks(512) {
        v.extend_from_slice(&crc32c::crc32c(c).to_be_bytes());
    }
    v
}

/// Checks that the replica of `block` on `dn` holds exactly `want` with a
/// checksum file that verifies, at generation stamp `gs` when given.
pub fn verify_replica(dn: &Path, block: u64, gs: Option<u64>, want: &[u8]) -> Result<(), String> {
    let r = replica(dn, block)
        .ok_or_else(|| format!("no replica of block {block} on {}", dn.display()))?;
    if let Some(g) = gs
        && r.gs != g
    {
        return Err(format!(
            "replica {} has gs {} (block's gs {g})",
            r.meta.display(),
            r.gs
        ));
    }
    let data = std::fs::read(&r.data).map_err(|e| format!("{}: {e}", r.data.display()))?;
    if data.len() != want.len() {
        return Err(format!(
            "{} holds {} bytes, {} expected",
            r.data.display(),
            data.len(),
            want.len()
        ));
    }
    if data != want {
        return Err(format!("{} holds other bytes", r.data.display()));
    }
    let meta = std::fs::read(&r.meta).map_err(|e| format!("{}: {e}", r.meta.display()))?;
    if meta != meta_bytes(want) {
        return Err(format!("checksums of {} do not verify", r.meta.display()));
    }
    Ok(())
}

/// Flips one byte of a file in place.
pub fn flip_byte(p: &Path, at: u64) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(p)
        .unwrap_or_else(|e| panic!("open {}: {e}", p.display()));
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, at).expect("read byte");
    b[0] ^= 0x5a;
    f.write_all_at(&b, at).expect("write byte");
    f.sync_all().expect("sync");
}

/// Result of one `leasefs fsck` run.
#[derive(Debug)]
pub struct Fsck {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Fsck {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(self.stdout.trim())
            .unwrap_or_else(|e| panic!("fsck --json printed no JSON ({e}): {self:?}"))
    }
}

pub fn fsck(args: &[&str]) -> Fsck {
    let o = Command::new(bin())
        .arg("fsck")
        .args(args)
        .output()
        .expect("run leasefs fsck");
    Fsck {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

impl Mount {
    /// `leasefs fsck MNT [args]`.
    pub fn fsck(&self, args: &[&str]) -> Fsck {
        let mnt = self.mnt.display().to_string();
        let mut a = vec![mnt.as_str()];
        a.extend_from_slice(args);
        fsck(&a)
    }

    /// `leasefs fsck MNT --json`: exit code and report.
    pub fn fsck_json(&self) -> (i32, serde_json::Value) {
        let f = self.fsck(&["--json"]);
        assert!(f.code == 0 || f.code == 1, "fsck could not run: {f:?}");
        (f.code, f.json())
    }

    /// Copies `data` into the mount as `rel` (cp from a scratch file).
    pub fn put(&self, rel: &str, data: &[u8]) {
        let p = self
            .dir
            .path()
            .join(format!("{}.src", rel.replace('/', "_")));
        std::fs::write(&p, data).unwrap();
        self.sh_ok(&format!("cp {} {rel}", p.display()));
    }

    /// Lines of the daemon log that contain every one of `words`.
    pub fn log_lines(&self, words: &[&str]) -> Vec<String> {
        self.log()
            .lines()
            .filter(|l| words.iter().all(|w| l.contains(w)))
            .map(str::to_string)
            .collect()
    }
}

/// The state fsck reports for datanode `id` (live, full, dead), or "?"
/// when it lists no such datanode.
pub fn datanode_state(report: &serde_json::Value, id: u64) -> String {
    report["datanode_states"]
        .as_array()
        .and_then(|a| a.iter().find(|d| d["id"].as_u64() == Some(id)))
        .and_then(|d| d["state"].as_str())
        .unwrap_or("?")
        .to_string()
}

/// (kind, block, datanode) of every problem of an fsck JSON report.
pub fn problems(report: &serde_json::Value) -> Vec<(String, Option<u64>, Option<u64>)> {
    report["problems"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|p| {
                    (
                        p["kind"].as_str().unwrap_or("?").to_string(),
                        p["block"].as_u64(),
                        p["datanode"].as_u64(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// A writer (tools/testkit/src/append.rs) appending the bytes of a source
/// file to a file of the mount from its current length, in pieces, with
/// fsyncs; after each fsync that returned it appends the file's length to
/// a side file. Its result line: `ok LEN` or `err ERRNO_NAME LEN STAGE`
/// (what failed: open/write/fsync/close).
pub struct Writer {
    pub child: std::process::Child,
    pub side: PathBuf,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Writer {
    /// Starts a writer copying `src` into the mount's `rel` in pieces of
    /// `piece` bytes, sleeping `sleep_ms` after each and fsyncing every
    /// `fsync_every` pieces (0: only at the end); waits until it has
    /// opened the file.
    pub fn start(
        m: &Mount,
        src: &Path,
        rel: &str,
        piece: usize,
        sleep_ms: u64,
        fsync_every: usize,
    ) -> Writer {
        use std::io::BufRead;
        let side = m
            .dir
            .path()
            .join(format!("{}.synced", rel.replace('/', "_")));
        let mut child = Command::new(testkit())
            .arg("append")
            .arg(src)
            .arg(rel)
            .arg("--side")
            .arg(&side)
            .args(["--piece", &piece.to_string()])
            .args(["--sleep-ms", &sleep_ms.to_string()])
            .args(["--fsync-every", &fsync_every.to_string()])
            .current_dir(&m.mnt)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("spawn testkit append");
        let out = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in std::io::BufReader::new(out).lines() {
                let Ok(l) = l else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let w = Writer {
            child,
            side,
            lines: rx,
        };
        let first = w
            .lines
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_default();
        assert!(
            first.starts_with("started"),
            "writer did not start: `{first}`"
        );
        w
    }

    /// Waits for the writer's result line (`ok LEN` / `err ...`).
    pub fn result(&mut self, max: Duration) -> String {
        let r = self
            .lines
            .recv_timeout(max)
            .unwrap_or_else(|_| panic!("writer gave no result within {max:?}"));
        let _ = self.child.wait();
        r
    }

    /// The largest length the writer saw fsynced.
    pub fn synced(&self) -> u64 {
        synced_len(&self.side)
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            kill(self.child.id(), libc::SIGKILL);
        }
        let _ = self.child.wait();
    }
}

/// The largest length recorded in a side file of fsynced lengths.
pub fn synced_len(side: &Path) -> u64 {
    std::fs::read_to_string(side)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .max()
        .unwrap_or(0)
}

/// The blocks of `rel` once every one of them is finalized: the kernel
/// sends RELEASE (which closes the file) after `close()` has returned.
pub fn wait_closed(m: &Mount, rel: &str) -> Vec<Block> {
    let mut b = Vec::new();
    let ok = wait_until(Duration::from_secs(10), || {
        b = blocks_of(m, rel);
        b.iter().all(|b| b.finalized)
    });
    assert!(ok, "{rel} not closed within 10 s: {b:?}");
    b
}
