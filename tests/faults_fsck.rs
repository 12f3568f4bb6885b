//! `leasefs fsck (MOUNTPOINT | --data DIR) [--json] [--repair]` (docs/SEMANTICS.md
//! "Datanode health, housekeeping and fsck"): verifies every block's replicas
//! (present, length, generation stamp, checksums), lists files open for
//! writing, prints a summary (a progress bar on a terminal), and exits 0
//! healthy, 1 problems, 2 could not run; with --repair 0 when everything
//! found was repaired. Offline (`--data`) only on an unmounted data
//! directory.

mod common;
use common::faults::*;
use common::*;

fn mount() -> Mount {
    Mount::with(Opts {
        datanodes: 3,
        replication: Some(3),
        o: vec![],
        args: Vec::new(),
    })
}

fn file(m: &Mount, rel: &str, len: usize, seed: u64) -> (Vec<u8>, Block) {
    let data = pattern(len, seed);
    m.put(rel, &data);
    let b = wait_closed(m, rel);
    assert_eq!(b.len(), 1, "{rel}: {b:?}");
    (data, b[0].clone())
}

fn read_cold(m: &Mount, rel: &str) -> Vec<u8> {
    drop_caches();
    m.read(rel)
}

/// The report has the documented shape: counters, open files, problems.
fn assert_report_shape(r: &serde_json::Value) {
    for k in [
        "files",
        "blocks",
        "replicas",
        "replication",
        "datanodes_alive",
        "datanodes",
    ] {
        assert!(r[k].is_u64(), "`{k}` is not a number: {r}");
    }
    for f in r["open_for_write"]
        .as_array()
        .unwrap_or_else(|| panic!("no open_for_write array: {r}"))
    {
        assert!(
            f["path"].is_string() && f["holder"].is_string() && f["comm"].is_string(),
            "{f}"
        );
        assert!(f["epoch"].is_u64() && f["live"].is_boolean(), "{f}");
    }
    for p in r["problems"]
        .as_array()
        .unwrap_or_else(|| panic!("no problems array: {r}"))
    {
        assert!(
            p["kind"].is_string() && p["path"].is_string() && p["detail"].is_string(),
            "{p}"
        );
        assert!(p["block"].is_u64() || p["block"].is_null(), "{p}");
        assert!(p["datanode"].is_u64() || p["datanode"].is_null(), "{p}");
        assert!(p["repaired"].is_boolean(), "{p}");
    }
}

#[test]
fn fsck_exits_0_on_a_healthy_mount_with_a_summary_and_a_json_report() {
    let m = mount();
    file(&m, "a", 100_000, 1);
    file(&m, "b", 10, 2);
    m.sh_ok("mkdir d && touch d/empty");
    let f = m.fsck(&[]);
    assert_eq!(f.code, 0, "{f:?}");
    assert!(f.stdout.contains("Status: HEALTHY"), "{f:?}");
    assert!(f.stdout.contains("Blocks: 2"), "{f:?}");
    let (code, r) = m.fsck_json();
    assert_eq!(code, 0);
    assert_report_shape(&r);
    assert_eq!(
        (r["blocks"].as_u64(), r["replicas"].as_u64()),
        (Some(2), Some(6)),
        "{r}"
    );
    assert_eq!(
        (
            r["replication"].as_u64(),
            r["datanodes"].as_u64(),
            r["datanodes_alive"].as_u64()
        ),
        (Some(3), Some(3), Some(3))
    );
    assert_eq!(r["problems"].as_array().map(Vec::len), Some(0), "{r}");
    assert_eq!(r["open_for_write"].as_array().map(Vec::len), Some(0), "{r}");
}

/// Four files, four kinds of bad replica; fsck names each (kind, block,
/// datanode) and exits 1; --repair fixes them all and exits 0.
#[test]
fn fsck_names_missing_stale_corrupt_and_short_replicas_exits_1_and_repair_makes_it_0() {
    let m = mount();
    let files: Vec<(Vec<u8>, Block)> = (0..4)
        .map(|i| file(&m, &format!("f{i}"), 150_000, 10 + i))
        .collect();
    let target = |i: usize| {
        let b = &files[i].1;
        (
            b.id,
            b.replicas[0],
            replica(&m.datanodes[b.replicas[0]], b.id).expect("replica"),
        )
    };
    // f0: replica files gone.
    let (id0, dn0, r0) = target(0);
    std::fs::remove_file(&r0.data).unwrap();
    std::fs::remove_file(&r0.meta).unwrap();
    // f1: a stale replica: older generation stamp, other (self-consistent)
    // bytes. It must never be served.
    let (id1, dn1, r1) = target(1);
    let garbage = pattern(150_000, 999);
    std::fs::write(&r1.data, &garbage).unwrap();
    std::fs::remove_file(&r1.meta).unwrap();
    std::fs::write(
        r1.meta
            .with_file_name(format!("blk_{id1}_{}.meta", r1.gs - 1)),
        meta_bytes(&garbage),
    )
    .unwrap();
    // f2: a flipped byte.
    let (id2, dn2, r2) = target(2);
    flip_byte(&r2.data, 77_777);
    // f3: the data file cut short.
    let (id3, dn3, r3) = target(3);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&r3.data)
        .unwrap()
        .set_len(1000)
        .unwrap();

    let (code, r) = m.fsck_json();
    assert_eq!(code, 1, "{r}");
    assert_report_shape(&r);
    let got = problems(&r);
    for want in [
        ("missing_replica", id0, dn0),
        ("stale_replica", id1, dn1),
        ("corrupt_replica", id2, dn2),
        ("bad_length", id3, dn3),
    ] {
        assert!(
            got.contains(&(want.0.to_string(), Some(want.1), Some(want.2 as u64))),
            "fsck does not report {want:?}: {r}"
        );
    }
    let text = m.fsck(&[]);
    assert_eq!(text.code, 1);
    assert!(
        text.stdout.contains("/f2") && !text.stdout.contains("HEALTHY"),
        "{text:?}"
    );
    for (i, (data, _)) in files.iter().enumerate() {
        assert!(
            read_cold(&m, &format!("f{i}")) == *data,
            "f{i} read wrong bytes"
        );
    }

    let rep = m.fsck(&["--repair", "--json"]);
    assert_eq!(rep.code, 0, "{rep:?}");
    let rr = rep.json();
    assert!(
        rr["problems"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["repaired"] == true),
        "{rr}"
    );
    let (code, r) = m.fsck_json();
    assert_eq!(code, 0, "after --repair: {r}");
    for (i, (data, _)) in files.iter().enumerate() {
        let b = &blocks_of(&m, &format!("f{i}"))[0];
        assert_eq!(b.replicas.len(), 3, "f{i}: {b:?}");
        for &dn in &b.replicas {
            verify_replica(&m.datanodes[dn], b.id, Some(b.gs), data)
                .unwrap_or_else(|e| panic!("f{i}: {e}"));
        }
    }
}

#[test]
fn fsck_exits_2_when_it_cannot_run() {
    let m = mount();
    let empty = tempfile::tempdir().unwrap();
    let cases: Vec<Vec<String>> = vec![
        vec!["/nonexistent/leasefs-mnt".into()],
        vec![empty.path().display().to_string()], // not a leasefs mount
        vec!["--data".into(), empty.path().display().to_string()], // no metadata
        vec![],
        vec![
            m.mnt.display().to_string(),
            "--data".into(),
            m.data.display().to_string(),
        ],
    ];
    for args in cases {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        let f = fsck(&a);
        assert_eq!(f.code, 2, "fsck {args:?}: {f:?}");
        assert!(
            !f.stderr.trim().is_empty(),
            "fsck {args:?} gave no reason: {f:?}"
        );
        assert!(!f.stderr.contains("panicked"), "{f:?}");
    }
}

#[test]
fn fsck_data_is_refused_with_exit_2_while_the_data_directory_is_mounted() {
    if etcd_backend() {
        // `fsck --data` reads DATA/meta.db: the SQLite backend only.
        return;
    }
    let m = mount();
    file(&m, "a", 1000, 3);
    let f = fsck(&["--data", &m.data.display().to_string()]);
    assert_eq!(f.code, 2, "{f:?}");
    assert!(f.stderr.contains("in use"), "{f:?}");
    assert_eq!(f.stderr.trim().lines().count(), 1, "one line: {f:?}");
    // The mount is unharmed.
    let (code, _) = m.fsck_json();
    assert_eq!(code, 0);
    assert!(read_cold(&m, "a") == pattern(1000, 3));
}

#[test]
fn fsck_data_checks_and_repairs_an_unmounted_data_directory_offline() {
    if etcd_backend() {
        // `fsck --data` reads DATA/meta.db: the SQLite backend only.
        return;
    }
    let mut m = mount();
    let (src, b) = file(&m, "a", 200_000, 4);
    m.unmount();
    let data = m.data.display().to_string();
    let f = fsck(&["--data", &data]);
    assert_eq!(f.code, 0, "{f:?}");
    assert!(f.stdout.contains("Status: HEALTHY"), "{f:?}");

    let dn = b.replicas[1];
    flip_byte(&replica(&m.datanodes[dn], b.id).unwrap().data, 123_456);
    let f = fsck(&["--data", &data, "--json"]);
    assert_eq!(f.code, 1, "{f:?}");
    assert!(
        problems(&f.json()).contains(&("corrupt_replica".into(), Some(b.id), Some(dn as u64))),
        "{f:?}"
    );
    let f = fsck(&["--data", &data, "--repair"]);
    assert_eq!(f.code, 0, "{f:?}");
    let f = fsck(&["--data", &data]);
    assert_eq!(f.code, 0, "{f:?}");
    verify_replica(&m.datanodes[dn], b.id, None, &src).unwrap_or_else(|e| panic!("{e}"));
    m.mount();
    assert!(read_cold(&m, "a") == src);
}

#[test]
fn fsck_lists_files_open_for_writing_and_a_file_left_open_by_a_dead_daemon() {
    let mut m = mount();
    let mut a = Agent::spawn(&m.mnt);
    a.ok("open w.log wc");
    a.ok("rep 1000 some line of the log");
    a.ok("fsync");
    let (code, r) = m.fsck_json();
    assert_eq!(code, 0, "a file being written is not a problem: {r}");
    let open = r["open_for_write"].as_array().unwrap();
    assert_eq!(open.len(), 1, "{r}");
    assert_eq!(open[0]["path"], "/w.log", "{r}");
    assert_eq!(
        open[0]["holder"],
        format!("{}:{}", hostname(), a.pid),
        "{r}"
    );
    assert_eq!(open[0]["comm"], comm_of(a.pid), "{r}");
    assert_eq!(open[0]["live"], true, "{r}");
    assert!(open[0]["epoch"].as_u64().unwrap_or(0) > 0, "{r}");
    let text = m.fsck(&[]);
    assert!(text.stdout.contains("/w.log: OPENFORWRITE"), "{text:?}");

    // The daemon dies with the file open: offline, it is left open.
    if etcd_backend() {
        // `fsck --data` reads DATA/meta.db: the SQLite backend only.
        return;
    }
    m.crash();
    drop(a);
    let data = m.data.display().to_string();
    let f = fsck(&["--data", &data, "--json"]);
    assert_eq!(f.code, 1, "{f:?}");
    let r = f.json();
    assert_eq!(r["open_for_write"][0]["path"], "/w.log", "{r}");
    assert_eq!(r["open_for_write"][0]["live"], false, "{r}");
    assert!(problems(&r).iter().any(|(k, _, _)| k == "left_open"), "{r}");
    let f = fsck(&["--data", &data, "--repair"]);
    assert_eq!(f.code, 0, "{f:?}");
    let f = fsck(&["--data", &data, "--json"]);
    assert_eq!(f.code, 0, "{f:?}");
    assert_eq!(f.json()["open_for_write"].as_array().map(Vec::len), Some(0));
    m.mount();
    let want = "some line of the log\n".repeat(1000);
    assert_eq!(read_cold(&m, "w.log"), want.as_bytes());
}

#[test]
fn fsck_shows_a_progress_bar_on_a_terminal_only() {
    if etcd_backend() {
        // `fsck --data` reads DATA/meta.db: the SQLite backend only.
        return;
    }
    let mut m = Mount::with(Opts {
        datanodes: 2,
        replication: Some(2),
        o: vec!["block_size=64K".into()],
        args: Vec::new(),
    });
    let src = pattern(130 * 65536, 5);
    m.put("many", &src);
    wait_closed(&m, "many");
    m.unmount();
    let cmd = format!("{} fsck --data {}", bin().display(), m.data.display());
    let o = std::process::Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .output()
        .expect("run script(1)");
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(
        out.contains("130/130 blocks") && out.contains("#####"),
        "no progress bar on a terminal: {out}"
    );
    // Piped, the output stays clean for scripts.
    let f = fsck(&["--data", &m.data.display().to_string()]);
    assert_eq!(f.code, 0, "{f:?}");
    assert!(
        !f.stderr.contains("blocks") && !f.stdout.contains('\r'),
        "{f:?}"
    );
}

/// Before generation stamps were recorded ahead of the replicas taking
/// them, a crash could leave every replica of a block one stamp ahead of
/// the metadata ("StaleReplica: generation stamp 11874 (expected 11865)" on
/// all three): the file read EIO for good and `fsck --repair` could not
/// help. With no replica at the recorded stamp, repair adopts those that
/// hold the block whole.
#[test]
fn fsck_repair_adopts_replicas_all_stamped_ahead_of_the_metadata() {
    let m = mount();
    let (data, b) = file(&m, "f", 150_000, 42);
    for &dn in &b.replicas {
        let r = replica(&m.datanodes[dn], b.id).expect("replica");
        let ahead = r
            .meta
            .with_file_name(format!("blk_{}_{}.meta", b.id, b.gs + 9));
        std::fs::rename(&r.meta, ahead).unwrap();
    }
    let (code, r) = m.fsck_json();
    assert_eq!(code, 1, "{r}");
    let rep = m.fsck(&["--repair"]);
    assert_eq!(rep.code, 0, "{}\n{}", rep.stdout, m.log());
    let (code, r) = m.fsck_json();
    assert_eq!(code, 0, "after --repair: {r}");
    assert!(read_cold(&m, "f") == data, "f read wrong bytes");
}
