//! Mounts with object-store datanodes (issue 30) on a real S3 store (three
//! Garage nodes, replication 3; mount-scripts/garage.sh): the bucket alone
//! (R=1), and one local directory plus the bucket (R=2). An fsynced file
//! survives kill -9 of the daemon byte for byte; `datanode list` shows the
//! bucket. Skipped, with a message, where Garage is not installed.

mod common;
use common::faults::{blocks_of, drop_caches, problems, wait_closed};
use common::garage::Garage;
use common::{Mount, Opts};

use std::path::PathBuf;
use std::time::Instant;

fn s3_opts(g: &Garage) -> Vec<String> {
    vec![format!(
        "s3_endpoint={},s3_region={},s3_credentials={}",
        g.endpoint,
        g.region,
        g.dir().join("env").display()
    )]
}

fn bytes(n: usize, seed: u32) -> Vec<u8> {
    (0..n as u32)
        .map(|i| (i.wrapping_add(seed).wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect()
}

/// cp + fsync, a small file and an append, kill -9, remount, read back.
fn survives_kill9(g: &Garage, paths: Vec<PathBuf>, replication: usize) {
    let src_dir = tempfile::tempdir().unwrap();
    let src = src_dir.path().join("src");
    let data = bytes(5_000_000, 7);
    std::fs::write(&src, &data).unwrap();
    let mut m = Mount::with_datanode_paths(
        Opts {
            replication: Some(replication),
            o: s3_opts(g),
            ..Opts::default()
        },
        paths,
    );
    m.sh_ok(&format!(
        "cp {} f && sync f && echo small > s && sync s && printf 'more' >> s && sync s",
        src.display()
    ));
    // The packets cp queued while a slice PUT was out went to the bucket
    // as one PUT (Storage::merge_writes), on the bucket alone and beside
    // a directory: 5 MB is 77 packets of 64 KiB, sent in a few PUTs.
    let st = m.leasefs(&["stats", m.mnt.to_str().unwrap(), "--once", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&st.stdout).expect("stats --json");
    assert!(
        v["packets_merged"].as_u64() > Some(0),
        "no packets merged into one PUT: {v}"
    );
    eprintln!(
        "packets acked {}, merged into the write before them {}",
        v["packets_acked"], v["packets_merged"]
    );
    let out = m.leasefs(&["datanode", "list", &m.mnt.display().to_string()]);
    let listed = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() && listed.contains(&format!("s3://{}", g.bucket)),
        "datanode list: {listed}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    m.crash();
    m.mount();
    let got = std::fs::read(m.path("f")).expect("read f after kill -9");
    assert!(
        got == data,
        "f after kill -9: {} bytes, not the {} written",
        got.len(),
        data.len()
    );
    assert_eq!(std::fs::read_to_string(m.path("s")).unwrap(), "small\nmore");
}

#[test]
fn fsynced_files_on_object_store_datanodes_survive_kill9() {
    if !Garage::installed() {
        eprintln!("skipped: garage not installed (mount-scripts/garage.sh install)");
        return;
    }
    let g = Garage::start();
    let t0 = Instant::now();
    survives_kill9(
        &g,
        vec![PathBuf::from(format!("s3://{}/only", g.bucket))],
        1,
    );
    eprintln!("bucket only, R=1: {:.2} s", t0.elapsed().as_secs_f64());
    let local = tempfile::tempdir().unwrap();
    let t0 = Instant::now();
    survives_kill9(
        &g,
        vec![
            local.path().join("dn"),
            PathBuf::from(format!("s3://{}/mixed", g.bucket)),
        ],
        2,
    );
    eprintln!("local + bucket, R=2: {:.2} s", t0.elapsed().as_secs_f64());
}

/// A byte flipped in the bucket's replica of a block (its slice object) is
/// found by fsck, named with the bucket's datanode, and repaired from the
/// directory's replica; the file reads back whole before and after.
/// Unmounted, `fsck --data` reaches the bucket as the mount did (the
/// options it recorded, no `AWS_*` in the environment), and its own `-o`
/// replaces them.
#[test]
fn a_corrupt_slice_in_the_bucket_is_reported_by_fsck_and_repaired_from_the_directory() {
    if !Garage::installed() {
        eprintln!("skipped: garage not installed (mount-scripts/garage.sh install)");
        return;
    }
    let g = Garage::start();
    let local = tempfile::tempdir().unwrap();
    let mut m = Mount::with_datanode_paths(
        Opts {
            replication: Some(2),
            o: s3_opts(&g),
            ..Opts::default()
        },
        vec![
            local.path().join("dn"),
            PathBuf::from(format!("s3://{}/fix", g.bucket)),
        ],
    );
    let data = bytes(300_000, 9);
    m.put("f", &data);
    let b = wait_closed(&m, "f");
    assert_eq!((b.len(), b[0].replicas.len()), (1, 2), "{b:?}");
    // The bucket is datanode 1 (its place in the list on a fresh mount).
    let slices: Vec<String> = g
        .list(0, &format!("fix/blk/{}/", b[0].id))
        .unwrap()
        .into_iter()
        .filter(|k| k.rsplit('/').next().is_some_and(|n| n.starts_with('s')))
        .collect();
    assert!(!slices.is_empty(), "no slice object of block {}", b[0].id);
    for key in &slices {
        let mut obj = g.get(0, key).unwrap();
        let last = obj.len() - 1;
        obj[last] ^= 0x40;
        g.put(0, key, &obj).unwrap();
    }
    let (code, rep) = m.fsck_json();
    assert_eq!(code, 1, "fsck found nothing wrong: {rep}");
    assert!(
        problems(&rep)
            .iter()
            .any(|(_, block, dn)| *block == Some(b[0].id) && *dn == Some(1)),
        "fsck does not name the bucket's replica of block {}: {rep}",
        b[0].id
    );
    assert!(m.read("f") == data, "a read served the corrupt slice");
    let f = m.fsck(&["--repair"]);
    assert_eq!(f.code, 0, "fsck --repair left problems: {f:?}");
    let (code, rep) = m.fsck_json();
    assert_eq!(code, 0, "still unhealthy after the repair: {rep}");
    let now = blocks_of(&m, "f");
    assert_eq!(now[0].replicas.len(), 2, "{now:?}");
    assert!(
        now[0].replicas.contains(&1),
        "the bucket lost its replica: {now:?}"
    );
    drop_caches();
    assert!(m.read("f") == data);

    m.unmount();
    let offline = |o: &[&str]| {
        let mut cmd = std::process::Command::new(common::bin());
        cmd.arg("fsck")
            .arg("--data")
            .arg(&m.data)
            .arg("--json")
            .args(o);
        for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("AWS_")) {
            cmd.env_remove(k);
        }
        let out = cmd.output().expect("run leasefs fsck --data");
        let rep: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "fsck --data printed no JSON ({e}): {}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
        let bucket = rep["datanode_states"]
            .as_array()
            .and_then(|a| a.iter().find(|d| d["id"] == 1))
            .map(|d| d["state"].clone());
        (out.status.code(), bucket, rep)
    };
    let (code, bucket, rep) = offline(&[]);
    assert_eq!(
        (code, bucket),
        (Some(0), Some("live".into())),
        "fsck --data: {rep}"
    );
    let (code, bucket, rep) = offline(&["-o", "s3_endpoint=http://127.0.0.1:1,s3_retry_timeout=1"]);
    assert_eq!(
        (code, bucket),
        (Some(1), Some("dead".into())),
        "fsck --data, the bucket's endpoint replaced by a closed port: {rep}"
    );
}

/// Figures (run by hand: `cargo test --release --test s3_mount figures --
/// --ignored --nocapture`, `S3_FIG_PACKET=1M` for 1 MiB packets), in one
/// run against the same store: 64 MiB sequential write+fsync and read
/// (after a remount, so from the datanodes), small files (create, 4 KiB,
/// close; without and with fsync) per second, and the p50 of fsync after
/// 4 KiB appends, for a mount on a local directory and one on the bucket
/// alone (R=1); then the store's own client (curl, one connection) doing
/// the same requests directly as the ceiling: one PUT and one GET of 64
/// MiB, 4 KiB PUTs one after the other.
#[test]
#[ignore]
fn figures_object_store_vs_local_directory() {
    if !Garage::installed() {
        eprintln!("skipped: garage not installed (mount-scripts/garage.sh install)");
        return;
    }
    let g = Garage::start();
    let local = tempfile::tempdir().unwrap();
    let packet = std::env::var("S3_FIG_PACKET").unwrap_or_else(|_| "64K".into());
    let mut rows = Vec::new();
    for (name, path) in [
        ("local directory", local.path().join("dn")),
        (
            "the bucket",
            PathBuf::from(format!("s3://{}/fig", g.bucket)),
        ),
    ] {
        let mut o = s3_opts(&g);
        o.push(format!("packet_size={packet}"));
        let mut m = Mount::with_datanode_paths(
            Opts {
                replication: Some(1),
                o,
                ..Opts::default()
            },
            vec![path],
        );
        let t = Instant::now();
        m.sh_ok("dd if=/dev/zero of=big bs=1M count=64 conv=fsync status=none");
        let w = 64.0 / t.elapsed().as_secs_f64();
        let st = m.leasefs(&["stats", m.mnt.to_str().unwrap(), "--once", "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&st.stdout).expect("stats --json");
        let (acked, merged) = (v["packets_acked"].as_u64(), v["packets_merged"].as_u64());
        eprintln!(
            "{name}: 64 MiB in {} packets, {} writes to the replicas",
            acked.unwrap_or(0),
            acked.unwrap_or(0) - merged.unwrap_or(0)
        );
        m.unmount();
        m.mount();
        let t = Instant::now();
        m.sh_ok("dd if=big of=/dev/null bs=1M status=none");
        let r = 64.0 / t.elapsed().as_secs_f64();
        let out = m.sh_ok(
            "python3 -c '
import os, time
def files(tag, n, sync):
    t = time.perf_counter()
    for i in range(n):
        fd = os.open(\"%s%d\" % (tag, i), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, b\"y\" * 4096)
        if sync: os.fsync(fd)
        os.close(fd)
    return n / (time.perf_counter() - t)
small = files(\"s\", 100, False)
durable = files(\"d\", 100, True)
fd = os.open(\"app\", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
ts = []
for i in range(200):
    os.write(fd, b\"x\" * 4096)
    t = time.perf_counter(); os.fsync(fd); ts.append(time.perf_counter() - t)
ts.sort()
print(\"%.0f %.0f %.2f %.2f\" % (small, durable, ts[len(ts)//2] * 1e3, ts[len(ts)*99//100] * 1e3))
'",
        );
        let f: Vec<&str> = out.split_whitespace().collect();
        rows.push(format!(
            "| {name} | {w:.1} MB/s | {r:.1} MB/s | {} | {} | {} / {} ms |",
            f[0], f[1], f[2], f[3]
        ));
    }
    let (w, r, p50, puts) = g.client_figures(64, 200);
    rows.push(format!(
        "| the store's client (curl) | {w:.1} MB/s (1 PUT) | {r:.1} MB/s (1 GET) | {puts:.0} PUTs of 4 KiB/s | | {p50:.2} ms (a 4 KiB PUT) |"
    ));
    eprintln!(
        "packet_size={packet}, R=1\n| | write+fsync 64 MiB | read 64 MiB | small files/s | durable small files/s | 4 KiB append + fsync p50 / p99 |\n|---|---|---|---|---|---|\n{}",
        rows.join("\n")
    );
}
