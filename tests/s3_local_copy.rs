//! Host-local copies (`-o local_copy`, issue 30 item 3) on a real S3 store
//! (three Garage nodes, mount-scripts/garage.sh) and a real etcd: two
//! daemons standing for two hosts (`-o host_id=a`, `b`), each with its own
//! local directory plus the one bucket, `--replication 1`. A file written
//! and fsynced on A is read exactly on B; B shows A's directory as
//! another host's (`elsewhere`), and its fsck is healthy; A reads its own
//! copy first, and still reads it with the store out of its reach; a file
//! deleted on B leaves no copy on A after A's sweep; kill -9 of A's daemon
//! and the loss of A's directory cost B nothing and trigger no repair.
//! Skipped, with a message, where Garage is not installed.

mod common;
use common::etcd::EtcdServer;
use common::garage::Garage;
use common::{Mount, Opts, wait_for};

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn bytes(n: usize, seed: u32) -> Vec<u8> {
    (0..n as u32)
        .map(|i| (i.wrapping_add(seed).wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect()
}

/// A daemon for host `host` of filesystem `prefix`: its directory `local`
/// (its copies) and the bucket, reached through `endpoint` (each host
/// talks to its own Garage node), with the mount options `more`.
fn host(
    etcd: &EtcdServer,
    g: &Garage,
    endpoint: &str,
    prefix: &str,
    host: &str,
    local: &Path,
    more: &str,
) -> Mount {
    Mount::with_datanode_paths(
        Opts {
            replication: Some(1),
            o: vec![
                format!(
                    "s3_endpoint={endpoint},s3_region={},s3_credentials={}",
                    g.region,
                    g.dir().join("env").display()
                ),
                format!("local_copy,host_id={host},housekeeping_interval=1{more}"),
            ],
            args: vec![
                "--meta".into(),
                format!("etcd://{}", etcd.endpoint()),
                "--prefix".into(),
                prefix.into(),
            ],
            ..Opts::default()
        },
        vec![
            local.to_path_buf(),
            PathBuf::from(format!("s3://{}/{prefix}", g.bucket)),
        ],
    )
}

/// `leasefs datanode list MNT --json`.
fn datanodes(m: &Mount) -> Vec<serde_json::Value> {
    let out = m.leasefs(&["datanode", "list", m.mnt.to_str().unwrap(), "--json"]);
    assert!(
        out.status.success(),
        "datanode list: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice::<Vec<serde_json::Value>>(&out.stdout).expect("a JSON array")
}

fn datanode_at(m: &Mount, path: &Path) -> serde_json::Value {
    datanodes(m)
        .into_iter()
        .find(|d| d["path"].as_str() == Some(path.to_str().unwrap()))
        .unwrap_or_else(|| panic!("{} not listed: {:?}", path.display(), datanodes(m)))
}

/// `leasefs fsck MNT --json`: exit code and report.
fn fsck(m: &Mount) -> (i32, serde_json::Value) {
    let out = m.leasefs(&["fsck", m.mnt.to_str().unwrap(), "--json"]);
    let code = out.status.code().unwrap_or(-1);
    let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "fsck printed no JSON ({e}): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (code, v)
}

/// `leasefs stats MNT --once --json`: the `bytes_read` of the datanode
/// whose path starts with `path` (the bucket's is its URL).
fn bytes_read(m: &Mount, path: &str) -> u64 {
    let out = m.leasefs(&["stats", m.mnt.to_str().unwrap(), "--once", "--json"]);
    assert!(out.status.success(), "stats: {out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    v["datanodes"]
        .as_array()
        .and_then(|a| {
            a.iter()
                .find(|d| d["path"].as_str().is_some_and(|p| p.starts_with(path)))
        })
        .and_then(|d| d["bytes_read"].as_u64())
        .unwrap_or_else(|| panic!("no datanode {path} in {v}"))
}

/// `df`'s size and used bytes of the filesystem at `mnt` (statvfs).
fn df(mnt: &Path) -> (u64, u64) {
    let s = nix::sys::statvfs::statvfs(mnt).expect("statvfs of the mount");
    let unit = s.fragment_size();
    (
        s.blocks() * unit,
        (s.blocks() - s.blocks_available()) * unit,
    )
}

/// Block ids with replica files in directory datanode `dn`.
fn blocks_in(dn: &Path) -> BTreeSet<u64> {
    let mut ids = BTreeSet::new();
    for state in ["rbw", "finalized"] {
        for e in std::fs::read_dir(dn.join(state))
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(id) = name
                .strip_prefix("blk_")
                .and_then(|r| r.split('_').next())
                .and_then(|n| n.parse().ok())
            {
                ids.insert(id);
            }
        }
    }
    ids
}

/// Makes the replica files of `block` in `dn` an hour old: past the
/// orphan grace (10 minutes), which has no option.
fn age(dn: &Path, block: u64) {
    let old = std::time::SystemTime::now() - Duration::from_secs(3600);
    for state in ["rbw", "finalized"] {
        for e in std::fs::read_dir(dn.join(state))
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = e.file_name().to_string_lossy().into_owned();
            if name == format!("blk_{block}") || name.starts_with(&format!("blk_{block}_")) {
                let f = std::fs::File::options()
                    .write(true)
                    .open(e.path())
                    .expect("open a replica file");
                f.set_modified(old).expect("set its mtime");
            }
        }
    }
}

#[test]
fn two_hosts_keep_their_own_copies_and_share_the_bucket() {
    if !Garage::installed() {
        eprintln!("skipped: garage not installed (mount-scripts/garage.sh install)");
        return;
    }
    let g = Garage::start();
    let etcd = EtcdServer::shared();
    let prefix = format!("local-copy-{}", std::process::id());
    let dirs = tempfile::tempdir().unwrap();
    let (dir_a, dir_b) = (dirs.path().join("a-dn"), dirs.path().join("b-dn"));
    let mut a = host(
        &etcd,
        &g,
        &g.endpoints[0],
        &prefix,
        "a",
        &dir_a,
        ",s3_capacity=10G",
    );
    let b = host(&etcd, &g, &g.endpoints[1], &prefix, "b", &dir_b, "");
    let dir_a = std::fs::canonicalize(&dir_a).unwrap();

    // Written and fsynced on A: one replica in the bucket (R=1) and A's
    // copy; B reads it exactly.
    let data = bytes(5_000_000, 7);
    let src = dirs.path().join("src");
    std::fs::write(&src, &data).unwrap();
    a.sh_ok(&format!(
        "cp {} f && sync f && echo small > s && sync s",
        src.display()
    ));
    let on_a = blocks_in(&dir_a);
    assert_eq!(on_a.len(), 2, "A's copies of f and s: {on_a:?}");
    wait_for(Duration::from_secs(10), "f on B", || b.path("f").exists());
    assert!(std::fs::read(b.path("f")).unwrap() == data, "f read on B");
    assert_eq!(std::fs::read_to_string(b.path("s")).unwrap(), "small\n");
    assert!(blocks_in(&dir_b).is_empty(), "B wrote nothing");

    // df: the bucket (the one datanode that counts) as `s3_capacity` on
    // A, as 1 PiB (unbounded) on B, less the bytes of the files on both;
    // the copies count for nothing.
    for (m, size) in [(&a, 10u64 << 30), (&b, 1 << 50)] {
        let (total, used) = df(&m.mnt);
        let files = data.len() as u64 + 6;
        assert_eq!(total, size, "df size on {}", m.mnt.display());
        assert!(
            (files..files + (64 << 10)).contains(&used),
            "df used {used} on {}, files {files}",
            m.mnt.display()
        );
    }

    // B shows A's directory as A's copies, never attached, not dead; its
    // fsck is healthy and neither counts nor reports them.
    wait_for(Duration::from_secs(10), "B to see A's directory", || {
        datanodes(&b)
            .iter()
            .any(|d| d["path"].as_str() == dir_a.to_str())
    });
    let seen = datanode_at(&b, &dir_a);
    assert_eq!(seen["state"], "elsewhere", "{seen}");
    assert_eq!(seen["host"], "a", "{seen}");
    assert_eq!(datanode_at(&a, &dir_a)["state"], "live");
    let (code, rep) = fsck(&b);
    assert_eq!(code, 0, "fsck on B: {rep}");
    assert_eq!(rep["problems"].as_array().map(Vec::len), Some(0), "{rep}");
    let (code, rep) = fsck(&a);
    assert_eq!(code, 0, "fsck on A: {rep}");

    // A reads its own copy first (a fresh mount: nothing cached)...
    a.unmount();
    wait_for(Duration::from_secs(30), "B to lead housekeeping", || {
        b.log().contains("housekeeping leadership taken")
    });
    a.mount();
    let bucket = "s3://";
    let (local0, store0) = (
        bytes_read(&a, dir_a.to_str().unwrap()),
        bytes_read(&a, bucket),
    );
    assert!(std::fs::read(a.path("f")).unwrap() == data, "f read on A");
    assert!(bytes_read(&a, dir_a.to_str().unwrap()) >= local0 + data.len() as u64);
    assert_eq!(bytes_read(&a, bucket), store0, "A read from the bucket");

    // ...and a file deleted on B loses its copy on A at A's next sweep
    // (past the orphan grace), while f's copy stays: A sweeps its own
    // copies though B leads housekeeping (B cannot reach them).
    a.sh_ok(&format!("cp {} g && sync g", src.display()));
    let g_blocks: BTreeSet<u64> = blocks_in(&dir_a).difference(&on_a).copied().collect();
    assert_eq!(g_blocks.len(), 1, "{g_blocks:?}");
    wait_for(Duration::from_secs(10), "g on B", || b.path("g").exists());
    b.sh_ok("rm g");
    for &blk in &g_blocks {
        age(&dir_a, blk);
    }
    wait_for(Duration::from_secs(30), "A's sweep of g's copy", || {
        blocks_in(&dir_a).is_disjoint(&g_blocks)
    });
    assert_eq!(blocks_in(&dir_a), on_a, "copies of live files swept");
    assert!(
        a.log().contains("host copy swept"),
        "not A's own sweep:\n{}",
        a.log()
    );

    // The store out of A's reach (its Garage node killed; B talks to
    // another): A still reads f, from its copy.
    a.unmount();
    a.mount();
    g.kill_node(0);
    assert!(
        std::fs::read(a.path("f")).unwrap() == data,
        "f on A, store gone"
    );

    // kill -9 of A's daemon, then A's directory gone: B loses nothing (it
    // reads the bucket), and its housekeeping rounds repair nothing.
    a.crash();
    std::fs::remove_dir_all(&dir_a).unwrap();
    assert!(
        std::fs::read(b.path("f")).unwrap() == data,
        "f on B after A died"
    );
    let rounds_from = b.log().len();
    common::let_time_pass(Duration::from_secs(3)); // housekeeping rounds every second
    let since = b.log()[rounds_from..].to_string();
    assert!(
        !since.contains("re-replicated") && !since.contains("housekeeping repaired"),
        "B repaired after A died:\n{since}"
    );
    assert_eq!(datanode_at(&b, &dir_a)["state"], "elsewhere");
    let (code, rep) = fsck(&b);
    assert_eq!(code, 0, "fsck on B after A died: {rep}");
    assert!(std::fs::read(b.path("f")).unwrap() == data);
}

/// `-o local_copy` on a SQLite store (one host) or without an object
/// store (nothing shared to count) is refused with one line.
#[test]
fn local_copy_needs_etcd_and_an_object_store() {
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let run = |args: &[&str]| {
        let out = std::process::Command::new(common::bin())
            .arg("mount")
            .arg(&mnt)
            .arg("--data")
            .arg(dir.path().join("data"))
            .arg("--datanode")
            .arg(dir.path().join("dn"))
            .args(["-o", "local_copy,host_id=a"])
            .args(args)
            .output()
            .expect("run leasefs mount");
        assert!(!out.status.success(), "mounted: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        err
    };
    assert!(run(&[]).contains("etcd"));
    let etcd = EtcdServer::shared();
    let err = run(&["--meta", &format!("etcd://{}", etcd.endpoint())]);
    assert!(err.contains("object-store datanode"), "{err}");
    assert!(!common::is_mounted(&mnt));
}
