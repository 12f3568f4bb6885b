//! Opening under the write lease (DESIGN §1 "Opening", "Details of the
//! contract"): one writer per file, `EBUSY` at once for a second writer,
//! readers never gated, close-then-reopen never refused, leases per file.

mod common;
use common::*;

use std::io::{BufRead, BufReader, Read};
use std::time::{Duration, Instant};

#[test]
fn second_writer_gets_ebusy_at_once_while_first_holds() {
    let m = Mount::new();
    let mut holder = Agent::spawn(&m.mnt);
    holder.ok("open f wac");
    holder.ok("write held");
    holder.ok("fsync");

    let mut other = Agent::spawn(&m.mnt);
    for flags in ["wa", "w", "x", "wt", "xa", "wc"] {
        let r = other.cmd(&format!("open f {flags}"));
        assert_eq!(
            err_name(&r),
            Some("EBUSY"),
            "open(f, {flags}) by a second writer: {r}"
        );
        assert!(reply_ms(&r) < 1000, "EBUSY must come at once, took {r}");
    }
    // One writer per file means one open file description, also within the
    // holding process.
    let r = holder.cmd("open f wa");
    assert_eq!(
        err_name(&r),
        Some("EBUSY"),
        "a second open by the holder process itself: {r}"
    );
    // The shell's view of the same rule; O_TRUNC by a non-holder cuts nothing.
    let o = m.sh("echo x >> f");
    assert!(!o.status.success(), "append by a second writer succeeded");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("busy"),
        "expected EBUSY, got {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        !m.sh(": > f").status.success(),
        "truncating open by a second writer succeeded"
    );
    assert_eq!(
        m.read_string("f"),
        "held\n",
        "a refused writer changed the file"
    );

    // Still refused a second later (EBUSY is not a transient race).
    holds_for(
        Duration::from_secs(1),
        "a second writer's open(f, O_APPEND) fails with EBUSY",
        || err_name(&other.cmd("open f wa")) == Some("EBUSY"),
    );

    // Once the holder is gone, the other writer gets it.
    holder.ok("close");
    let r = other.cmd("open f wa");
    assert!(r.starts_with("ok"), "open after the holder closed: {r}");
    other.ok("write second");
    other.ok("close");
    assert_eq!(m.read_string("f"), "held\nsecond\n");
}

#[test]
fn lease_belongs_to_the_inode_not_the_name() {
    let m = Mount::new();
    m.sh_ok("echo base > f; ln f link");
    let mut holder = Agent::spawn(&m.mnt);
    holder.ok("open f wa");
    holder.ok("write through f");
    holder.ok("fsync");
    // A hard link is the same file: refused.
    let o = m.sh("echo x >> link");
    assert!(
        !o.status.success(),
        "a writer got the held file through its other name"
    );
    // Replacing the name (write a temp file, rename over) leaves a new,
    // free file; the holder keeps writing the old one.
    m.sh_ok("echo new > tmp && mv tmp f && echo more >> f");
    assert_eq!(m.lease_state("f"), "free");
    assert_eq!(m.lease_state("link"), "held");
    holder.ok("write still old");
    holder.ok("close");
    assert_eq!(m.read_string("f"), "new\nmore\n");
    assert_eq!(m.read_string("link"), "base\nthrough f\nstill old\n");
}

#[test]
fn descriptors_shared_by_fork_share_the_lease() {
    let m = Mount::new();
    m.sh_ok("set -e; exec 3>>f; for i in 1 2 3; do (echo child$i >&3); done; echo parent >&3; exec 3>&-");
    assert_eq!(m.read_string("f"), "child1\nchild2\nchild3\nparent\n");
    assert_eq!(m.lease_state("f"), "free");
}

#[test]
fn readers_are_never_refused_or_delayed_by_a_writer() {
    let m = Mount::new();
    let mut holder = Agent::spawn(&m.mnt);
    holder.ok("open f wac");
    holder.ok("write visible");
    holder.ok("fsync");
    holder.ok("write buffered"); // not flushed: the writer is mid-stream

    let t = Instant::now();
    let out = m.sh_ok("cat f");
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "cat took {:?}",
        t.elapsed()
    );
    assert!(out.starts_with("visible\n"), "cat read {out:?}");

    let mut reader = Agent::spawn(&m.mnt);
    for flags in ["r", "rn"] {
        let r = reader.cmd(&format!("open f {flags}"));
        assert!(r.starts_with("ok"), "O_RDONLY open refused: {r}");
        assert!(reply_ms(&r) < 1000, "O_RDONLY open delayed: {r}");
        reader.ok("close");
    }

    // Many readers at once, while the writer still holds the file.
    let t = Instant::now();
    m.sh_ok(
        "for i in $(seq 20); do cat f > /dev/null & done; wait; head -c 8 f; stat f > /dev/null",
    );
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "20 readers took {:?}",
        t.elapsed()
    );
    assert_eq!(m.lease_state("f"), "held");
    holder.ok("close");
    assert_eq!(m.read_string("f"), "visible\nbuffered\n");
}

#[test]
fn close_then_reopen_never_fails_spuriously() {
    let m = Mount::new();
    let t = Instant::now();
    m.sh_ok("set -e; for i in $(seq 200); do echo $i >> f; done");
    let want: String = (1..=200).map(|i| format!("{i}\n")).collect();
    assert_eq!(m.read_string("f"), want, "200 appends");

    m.sh_ok("set -e; for i in $(seq 100); do echo a > g; echo b >> g; done");
    assert_eq!(m.read_string("g"), "a\nb\n");

    // Each append by a new process: the previous one's RELEASE races with
    // the next open.
    m.sh_ok("set -e; for i in $(seq 100); do /bin/echo $i >> h; done");
    let want: String = (1..=100).map(|i| format!("{i}\n")).collect();
    assert_eq!(
        m.read_string("h"),
        want,
        "100 appends by separate processes"
    );
    assert!(
        t.elapsed() < Duration::from_secs(30),
        "took {:?}",
        t.elapsed()
    );
}

#[test]
fn racing_writers_hold_one_at_a_time_and_never_interleave() {
    const WRITERS: usize = 8;
    const MIB: usize = 1 << 20;
    let m = Mount::new();
    let mut refused = 0;
    for round in 0..5 {
        let path = format!("race{round}");
        // Each racer (tools/testkit/src/race.rs) opens the file for append
        // once its standard input ends, writes 1 MiB of its two-digit id in
        // 64 KiB writes and closes; all of them are released at once.
        let mut racers: Vec<_> = (0..WRITERS)
            .map(|w| {
                let mut c = std::process::Command::new(testkit())
                    .args(["racer", path.as_str(), &w.to_string()])
                    .current_dir(&m.mnt)
                    .stdin(std::process::Stdio::piped())
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .expect("spawn racer");
                let mut out = BufReader::new(c.stdout.take().expect("stdout"));
                let mut ready = String::new();
                out.read_line(&mut ready).expect("racer ready");
                assert_eq!(ready.trim(), "ready", "a racer did not start");
                (c, out)
            })
            .collect();
        for (c, _) in &mut racers {
            drop(c.stdin.take());
        }
        // (writer, opened, started closing)
        let mut held: Vec<(usize, f64, f64)> = Vec::new();
        let mut busy = 0;
        for (c, mut stdout) in racers {
            let mut out = String::new();
            stdout.read_to_string(&mut out).expect("racer output");
            let o = c.wait_with_output().expect("racer");
            let out = out.trim().to_string();
            assert!(
                o.status.success(),
                "racer failed: {out} {}",
                String::from_utf8_lossy(&o.stderr)
            );
            let f: Vec<&str> = out.split(' ').collect();
            match f.as_slice() {
                ["ok", w, a, b] => {
                    held.push((w.parse().unwrap(), a.parse().unwrap(), b.parse().unwrap()))
                }
                ["err", "EBUSY"] => busy += 1,
                _ => panic!(
                    "round {round}: a racer reported `{out}` (only success or EBUSY are allowed)"
                ),
            }
        }
        assert!(!held.is_empty(), "round {round}: every writer got EBUSY");
        refused += busy;
        assert_eq!(held.len() + busy, WRITERS);
        held.sort_by(|a, b| a.1.total_cmp(&b.1));
        for p in held.windows(2) {
            assert!(
                p[1].1 >= p[0].2,
                "round {round}: writer {} opened at {:.6} while writer {} held the file until {:.6}",
                p[1].0,
                p[1].1,
                p[0].0,
                p[0].2
            );
        }
        let data = m.read(&path);
        assert_eq!(
            data.len(),
            held.len() * MIB,
            "round {round}: {} writers got the lease",
            held.len()
        );
        for (k, (w, _, _)) in held.iter().enumerate() {
            let want = format!("{w:02}").repeat(MIB / 2);
            let got = &data[k * MIB..(k + 1) * MIB];
            assert!(
                got == want.as_bytes(),
                "round {round}: MiB {k} is not writer {w}'s bytes alone (starts {:?})",
                String::from_utf8_lossy(&got[..16])
            );
        }
    }
    assert!(
        refused > 0,
        "no writer was ever refused: the writers did not race"
    );
}

#[test]
fn hundred_writers_on_hundred_files_never_wait_for_each_other() {
    // With lease_wait a writer that waited for another would show up as
    // time, not only as EBUSY.
    let m = Mount::with_o("lease_wait=30");
    if etcd_backend() {
        // Over etcd, creates in one directory are transactions on its
        // inode and run one after another (README, "Cost"); this test is
        // about leases, so the names exist before the writers race.
        for i in 0..100 {
            std::fs::write(m.path(&format!("f{i:03}")), b"").expect("create");
        }
    }
    // 100 processes released at once (tools/testkit/src/race.rs), each
    // opening a file of its own, writing, holding it for a second, closing.
    let o = testkit_run(&m.mnt, "hold-open", &["100", "--hold-ms", "1000"]);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "some writer failed:\n{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let rows: Vec<Vec<f64>> = out
        .lines()
        .map(|l| l.split(' ').skip(1).map(|v| v.parse().unwrap()).collect())
        .collect();
    assert_eq!(rows.len(), 100, "{out}");
    let start = rows[0][1];
    let last_open = rows.iter().map(|r| r[2]).fold(f64::MIN, f64::max);
    let first_close = rows.iter().map(|r| r[3]).fold(f64::MAX, f64::min);
    let end = rows.iter().map(|r| r[4]).fold(f64::MIN, f64::max);
    assert!(
        last_open < first_close,
        "not all 100 leases were held at once: last open at +{:.3}s, first close at +{:.3}s",
        last_open - start,
        first_close - start
    );
    assert!(
        end - start < 4.0,
        "100 one-second writers took {:.3}s in all",
        end - start
    );
    for i in 0..100 {
        assert_eq!(m.read_string(&format!("f{i:03}")), format!("file {i}\n"));
    }
}

#[test]
fn reader_sees_visible_length_grow_while_file_is_written() {
    const CHUNKS: usize = 30;
    let m = Mount::new();
    let chunk = |i: usize| format!("{i:07}\n").repeat(2048); // 16 KiB
    let total = CHUNKS * 16384;
    let mut w = Agent::spawn(&m.mnt);
    w.ok("open f wac");
    w.ok("rep 2048 0000000");
    w.ok("fsync");
    let out_path = m.dir.path().join("followed");
    // The reader (tools/testkit/src/follow.rs) says each size it sees.
    let mut reader = std::process::Command::new(testkit())
        .args([
            "follow",
            m.path("f").to_str().unwrap(),
            out_path.to_str().unwrap(),
            &total.to_string(),
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn reader");
    let (tx, said) = std::sync::mpsc::channel();
    let stdout = reader.stdout.take().expect("stdout");
    std::thread::spawn(move || {
        for l in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    let mut sizes: Vec<u64> = Vec::new();
    let mut done = false;
    let take = |sizes: &mut Vec<u64>, done: &mut bool| {
        while let Ok(l) = said.try_recv() {
            match l.strip_prefix("size ") {
                Some(n) => sizes.push(n.parse().expect("size")),
                None => *done |= l == "done",
            }
        }
    };
    for i in 1..CHUNKS {
        // The next chunk once the reader has seen the last fsync's length.
        let seen = (i * 16384) as u64;
        wait_for(
            Duration::from_secs(10),
            &format!("the reader to see {seen} bytes"),
            || {
                take(&mut sizes, &mut done);
                sizes.last().is_some_and(|&s| s >= seen)
            },
        );
        w.ok(&format!("rep 2048 {i:07}"));
        w.ok("fsync");
    }
    w.ok("close");
    wait_for(Duration::from_secs(40), "the reader to finish", || {
        take(&mut sizes, &mut done);
        done
    });
    let st = reader.wait().expect("reader");
    assert!(st.success(), "reader: {st:?}");
    assert!(
        sizes.windows(2).all(|p| p[0] <= p[1]),
        "visible size went backwards: {sizes:?}"
    );
    assert!(
        sizes.len() >= 5,
        "the reader saw the size change only {} times: {sizes:?}",
        sizes.len()
    );
    assert!(
        sizes[0] < total as u64,
        "the reader saw nothing before the writer finished: {sizes:?}"
    );
    let want: String = (0..CHUNKS).map(chunk).collect();
    let got = std::fs::read(&out_path).expect("reader output");
    assert_eq!(
        got.len(),
        want.len(),
        "the reader read {} of {} bytes",
        got.len(),
        want.len()
    );
    assert!(
        got == want.as_bytes(),
        "the streamed bytes differ from what was written"
    );
}
