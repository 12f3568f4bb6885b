//! The write contract of docs/SEMANTICS.md "Writing" through a real mount: sequential
//! writes only, O_APPEND at the real end, truncate and O_TRUNC, files of
//! several blocks, the visible length that readers follow, backpressure
//! from a slow replica, durability across kill -9 of the daemon, and
//! unmounting with plain `umount`.

mod common;
use common::faults::pattern;
use common::*;

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// Writes `data` to a scratch file outside the mount; returns its path.
fn scratch_file(m: &Mount, name: &str, data: &[u8]) -> String {
    let p = m.dir.path().join(name);
    std::fs::write(&p, data).unwrap();
    p.display().to_string()
}

/// The errno name of an agent's answer, or `ok`.
fn errno_or_ok(reply: &str) -> String {
    err_name(reply).unwrap_or("ok").to_string()
}

/// Finalized (and rbw) replica data files of a datanode.
fn replicas(dn: &Path, state: &str) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dn.join(state))
        .map(|r| {
            r.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("blk_") && !n.ends_with(".meta"))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

// ---- 2. sequential writes only -------------------------------------------

#[test]
fn write_at_an_offset_other_than_the_end_fails_einval_and_leaves_the_file_unchanged() {
    let m = Mount::new();
    m.sh_ok("printf hello > f");
    let mut w = Agent::spawn(&m.mnt);
    w.ok("open f w");
    let mut res: Vec<String> = [(1, "XY"), (0, "XY"), (9, "XY"), (4, "XY")]
        .into_iter()
        .map(|(off, data)| errno_or_ok(&w.cmd(&format!("pwrite {off} {data}"))))
        .collect();
    // A plain write from the descriptor's position (0), not the end.
    res.push(errno_or_ok(&w.cmd("put Z")));
    w.ok("close");
    assert_eq!(res.join(" "), "EINVAL EINVAL EINVAL EINVAL EINVAL");
    assert_eq!(m.read_string("f"), "hello");
    assert!(
        m.log().contains("append-only"),
        "no log line says why:\n{}",
        m.log()
    );
    // dd conv=notrunc into the middle fails too, and changes nothing.
    let o = m.sh("dd if=/dev/zero of=f bs=1 count=2 seek=1 conv=notrunc status=none");
    assert!(
        !o.status.success(),
        "dd into the middle of a file succeeded"
    );
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("Invalid argument"),
        "{o:?}"
    );
    assert_eq!(m.read_string("f"), "hello");
    // At the end it is an ordinary append.
    m.sh_ok("printf '!!' | dd of=f bs=1 seek=5 conv=notrunc status=none");
    assert_eq!(m.read_string("f"), "hello!!");
}

#[test]
fn o_append_writes_always_land_at_the_end() {
    let m = Mount::new();
    let mut w = Agent::spawn(&m.mnt);
    for cmd in [
        "open a wac",
        "put aa",
        "seek 0",
        "put bb",
        "pwrite 0 cc", // Linux: pwrite on O_APPEND appends
        "close",
        "open a wa", // a fresh descriptor at offset 0
        "put dd",
        "close",
        "open a xa",
        "seek 1",
        "put ee",
        "close",
    ] {
        w.ok(cmd);
    }
    assert_eq!(m.read_string("a"), "aabbccddee");
    m.sh_ok("echo ff >> a; echo gg >> a");
    assert_eq!(m.read_string("a"), "aabbccddeeff\ngg\n");
}

#[test]
fn truncate_shrinks_and_grows_with_zeros() {
    // Small blocks, so that shrinking drops blocks and growing adds them.
    let mut m = Mount::with_o("block_size=64K,packet_size=16K");
    let src = pattern(200_000, 1);
    let s = scratch_file(&m, "src", &src);
    m.sh_ok(&format!("cp {s} f"));
    m.sh_ok("truncate -s 70000 f");
    assert_eq!(m.sh_ok("stat -c %s f"), "70000\n");
    assert!(m.read("f") == src[..70000], "shrunk file is not the prefix");
    m.sh_ok("truncate -s 250000 f");
    assert_eq!(m.sh_ok("stat -c %s f"), "250000\n");
    let got = m.read("f");
    assert!(got[..70000] == src[..70000], "grow changed the kept prefix");
    assert!(
        got[70000..].iter().all(|&b| b == 0),
        "grown part is not zeros"
    );
    // Shrink to the middle of the first block, then append after it.
    m.sh_ok("truncate -s 1000 f && printf tail >> f");
    let mut want = src[..1000].to_vec();
    want.extend_from_slice(b"tail");
    assert!(m.read("f") == want);
    // The holder's own ftruncate on its descriptor, then writing on.
    let mut w = Agent::spawn(&m.mnt);
    for cmd in ["open f wa", "put XYZ", "ftruncate 10", "put after", "close"] {
        w.ok(cmd);
    }
    drop(w); // it works in the mount: gone before the unmount
    let mut want = src[..10].to_vec();
    want.extend_from_slice(b"after");
    assert!(m.read("f") == want, "got {:?}", m.read("f"));
    m.unmount();
    m.mount();
    assert!(m.read("f") == want, "after remount got {:?}", m.read("f"));
}

#[test]
fn o_trunc_starts_the_file_afresh() {
    let m = Mount::with_o("block_size=64K,packet_size=16K");
    let src = pattern(300_000, 2);
    let s = scratch_file(&m, "src", &src);
    m.sh_ok(&format!("cp {s} f"));
    // (The last block is finalised by the RELEASE that follows close().)
    assert!(
        wait_until(Duration::from_secs(5), || replicas(
            &m.datanodes[0],
            "finalized"
        )
        .len()
            == 5),
        "{:?}",
        replicas(&m.datanodes[0], "finalized")
    );
    m.sh_ok("echo x > f");
    assert_eq!(m.read_string("f"), "x\n");
    assert_eq!(m.sh_ok("stat -c %s f"), "2\n");
    // The old blocks are gone from the datanodes, the new one is there.
    for dn in &m.datanodes {
        assert!(
            wait_until(Duration::from_secs(5), || replicas(dn, "finalized").len()
                == 1),
            "{}: {:?}",
            dn.display(),
            replicas(dn, "finalized")
        );
    }
    // O_TRUNC on an empty result, then appending.
    m.sh_ok(": > f; echo y >> f");
    assert_eq!(m.read_string("f"), "y\n");
}

#[test]
fn o_trunc_of_a_running_program_fails_etxtbsy_and_leaves_it_running() {
    // With FUSE_ATOMIC_O_TRUNC the kernel emptied its copy of the file as
    // soon as the open succeeded, before refusing the truncation, and the
    // program crashed in a few percent of tries (pjdfstest open::etxtbsy).
    let m = Mount::new();
    let sleep = std::env::var_os("PATH")
        .and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("sleep"))
                .find(|p| p.is_file())
        })
        .expect("sleep(1) on the PATH");
    let size = std::fs::metadata(&sleep).expect("stat sleep").len();
    // One process copies, starts and opens each program: the test's own
    // threads fork for other tests, and a copy of a descriptor open for
    // writing in a forked child would make the exec itself fail.
    let mut a = Agent::spawn(m.dir.path());
    let mut bad = Vec::new();
    for i in 0..60 {
        let p = m.mnt.join(format!("prog{i}"));
        let p = p.display();
        a.ok(&format!("copy {} {p} 755", sleep.display()));
        let pid = a.ok(&format!("spawn {p} 10"));
        let got: Vec<String> = ["w", "x", "rt"]
            .into_iter()
            .map(|flags| {
                let r = a.cmd(&format!("open {p} {flags}"));
                if r.starts_with("ok") {
                    a.ok("close");
                }
                errno_or_ok(&r)
            })
            .collect();
        let alive = a.ok(&format!("running {pid}")) == "yes";
        if alive {
            a.ok(&format!("kill {pid}"));
        }
        let now = std::fs::metadata(m.mnt.join(format!("prog{i}")))
            .map(|md| md.len())
            .unwrap_or(0);
        if got != ["ETXTBSY"; 3] || !alive || now != size {
            bad.push(format!("({i}, {got:?}, {alive}, {now})"));
        }
    }
    assert_eq!(bad, Vec::<String>::new());
}

// ---- 3. files of several blocks ------------------------------------------

#[test]
fn a_multi_block_file_reads_back_identical_with_one_finalized_replica_per_block_per_datanode() {
    let mut m = Mount::with_o("block_size=128K,packet_size=16K");
    let n = (1 << 20) + 123;
    let src = pattern(n, 3);
    let s = scratch_file(&m, "src", &src);
    m.sh_ok(&format!("dd if={s} of=f bs=100000 status=none"));
    assert!(m.read("f") == src, "multi-block file differs");
    let blocks = n.div_ceil(128 << 10);
    assert_eq!(blocks, 9);
    for dn in &m.datanodes {
        // The last block is finalised by RELEASE, which the kernel sends
        // after close() has returned.
        let metas = || {
            std::fs::read_dir(dn.join("finalized"))
                .map(|r| {
                    r.flatten()
                        .filter(|e| e.file_name().to_string_lossy().ends_with(".meta"))
                        .count()
                })
                .unwrap_or(0)
        };
        wait_until(Duration::from_secs(5), || {
            replicas(dn, "finalized").len() == blocks && metas() == blocks
        });
        let fin = replicas(dn, "finalized");
        assert_eq!(fin.len(), blocks, "{}: {fin:?}", dn.display());
        assert!(
            replicas(dn, "rbw").is_empty(),
            "{}: rbw left after close",
            dn.display()
        );
        // Each replica has its checksum file, naming the generation stamp.
        for b in &fin {
            let metas: Vec<_> = std::fs::read_dir(dn.join("finalized"))
                .unwrap()
                .flatten()
                .filter(|e| {
                    let f = e.file_name().to_string_lossy().into_owned();
                    f.starts_with(&format!("{b}_")) && f.ends_with(".meta")
                })
                .collect();
            assert_eq!(metas.len(), 1, "{b} on {}", dn.display());
        }
        // Replica lengths add up to the file: 8 full blocks and 123 bytes.
        let mut lens: Vec<u64> = fin
            .iter()
            .map(|b| {
                std::fs::metadata(dn.join("finalized").join(b))
                    .unwrap()
                    .len()
            })
            .collect();
        lens.sort();
        assert_eq!(lens[0], 123);
        assert!(lens[1..].iter().all(|&l| l == 128 << 10), "{lens:?}");
    }
    m.unmount();
    m.mount();
    assert!(m.read("f") == src, "multi-block file differs after remount");
}

// ---- 4. the visible length; readers following a writer --------------------

/// A writer of `src` (a file outside the mount) into the mount's `f`, in
/// 64 KiB chunks with an fsync after every other one (the rest become
/// visible as the streamer acknowledges them), paced by its reader: after
/// each fsync, `follow(fsynced)` is called until it returns true, and it
/// is called all the while each command runs, so that the reader reads
/// while the file grows however the machine schedules the two.
struct ChunkWriter {
    w: Agent,
    src: String,
    len: usize,
}

impl ChunkWriter {
    fn start(m: &Mount, src: &str, len: usize) -> ChunkWriter {
        let mut w = Agent::spawn(&m.mnt);
        w.ok("open f wct");
        ChunkWriter {
            w,
            src: src.to_string(),
            len,
        }
    }

    /// Runs `cmd`, calling `follow(0)` until it is answered (looking for
    /// the answer for up to 5 ms between two calls).
    fn run(&mut self, cmd: &str, follow: &mut impl FnMut(usize) -> bool) {
        self.w.send(cmd);
        loop {
            follow(0);
            if let Some(r) = self.w.reply(Duration::from_millis(5)) {
                assert!(r.starts_with("ok"), "writer: `{cmd}` answered `{r}`");
                return;
            }
        }
    }

    /// Writes chunks `from..`, then closes the file.
    fn write_from(&mut self, from: usize, follow: &mut impl FnMut(usize) -> bool) {
        for (k, off) in (0..self.len).step_by(65536).enumerate().skip(from) {
            self.run(&format!("write-from {} {off} 65536", self.src), follow);
            if k % 2 == 0 {
                self.run("fsync", follow);
                let synced = (off + 65536).min(self.len);
                wait_for(
                    Duration::from_secs(10),
                    &format!("the reader to see the {synced} bytes fsynced"),
                    || follow(synced),
                );
            }
        }
        self.run("close", follow);
    }
}

#[test]
fn readers_of_a_file_being_written_see_only_written_bytes_and_a_growing_size() {
    let m = Mount::new();
    let src = pattern(40 * 65536, 4);
    let s = scratch_file(&m, "src", &src);
    let mut w = ChunkWriter::start(&m, &s, src.len());
    let f = m.path("f");
    let mut last = 0u64;
    let mut sizes = std::collections::BTreeSet::new();
    let mut reads = 0;
    // One look at the file: its size, then its bytes. True once `want`
    // bytes are visible.
    let mut look = |want: usize| {
        let size = std::fs::metadata(&f).unwrap().len();
        assert!(size >= last, "stat size went back from {last} to {size}");
        assert!(size as usize <= src.len());
        last = size;
        sizes.insert(size);
        let data = std::fs::read(&f).unwrap();
        assert!(
            data.len() as u64 >= size,
            "read {} bytes, stat said {size}",
            data.len()
        );
        assert!(data.len() <= src.len(), "read past what was written");
        if let Some(i) = (0..data.len()).find(|&i| data[i] != src[i]) {
            panic!(
                "reader saw a wrong byte at offset {i} of {} read",
                data.len()
            );
        }
        reads += 1;
        size as usize >= want
    };
    w.write_from(0, &mut look);
    let growing: Vec<_> = sizes
        .iter()
        .filter(|&&s| s > 0 && (s as usize) < src.len())
        .collect();
    assert!(
        growing.len() >= 5,
        "stat did not follow the writer: sizes {sizes:?} over {reads} reads"
    );
    assert_eq!(std::fs::metadata(&f).unwrap().len() as usize, src.len());
    assert!(m.read("f") == src);
}

/// statx(2) is answered (FUSE_STATX) with every basic field and the
/// birth time. Before, its ENOSYS had the kernel fall back to GETATTR,
/// and in that fallback (Linux 6.6 to at least 6.18) decide whether to
/// ask from the attribute mask it had read before the STATX went out:
/// the first `stat` of a mount could return the kernel's own size of a
/// file being written, grown by a write not yet acknowledged (the test
/// above failed so about once in 20–60 runs under load).
#[test]
fn statx_gives_the_birth_time_and_the_visible_length_of_a_file_being_written() {
    let mut m = Mount::new();
    let before = std::time::SystemTime::now() - Duration::from_secs(1);
    let mut w = Agent::spawn(&m.mnt);
    w.ok("open f wct");
    w.ok("put 0123456789");
    let f = m.path("f");
    let md = std::fs::metadata(&f).unwrap();
    let born = md.created().expect("statx gives a birth time");
    assert!(born >= before && born <= std::time::SystemTime::now());
    // Nothing fsynced yet: the visible length is what the streamer has
    // acknowledged, never more than was written.
    assert!(md.len() <= 10, "size {}", md.len());
    w.ok("fsync");
    assert_eq!(std::fs::metadata(&f).unwrap().len(), 10);
    w.ok("close");
    std::thread::sleep(Duration::from_millis(20));
    std::fs::write(&f, b"later").unwrap();
    let md = std::fs::metadata(&f).unwrap();
    assert_eq!(md.created().unwrap(), born, "rewriting kept the birth time");
    assert!(md.modified().unwrap() > born);
    // A symlink's size is the length of its target, as on ext4.
    std::os::unix::fs::symlink("a/target", m.path("l")).unwrap();
    assert_eq!(std::fs::symlink_metadata(m.path("l")).unwrap().len(), 8);
    drop(w);
    m.unmount();
    m.mount();
    assert_eq!(std::fs::metadata(&f).unwrap().created().unwrap(), born);
    assert_eq!(std::fs::symlink_metadata(m.path("l")).unwrap().len(), 8);
}

#[test]
fn tail_f_follows_a_file_being_written_and_gets_every_byte() {
    let m = Mount::new();
    let src = pattern(30 * 65536, 5);
    let s = scratch_file(&m, "src", &src);
    let out = m.dir.path().join("tail.out");
    let mut w = ChunkWriter::start(&m, &s, src.len());
    let f = m.path("f");
    // The first chunk, fsynced: visible before anyone follows.
    w.run(&format!("write-from {s} 0 65536"), &mut |_| true);
    w.run("fsync", &mut |_| true);
    assert!(
        f.metadata().is_ok_and(|md| md.len() > 0),
        "writer wrote nothing visible"
    );
    // GNU tail polls (inotify does not see FUSE writes) and stops once the
    // writer is gone, after a last read.
    let tail = Command::new("tail")
        .args([
            "-c",
            "+1",
            "-f",
            "---disable-inotify",
            "-s",
            "0.05",
            "--pid",
        ])
        .arg(w.w.pid.to_string())
        .arg(&f)
        .stdout(std::fs::File::create(&out).unwrap())
        .spawn()
        .unwrap();
    let mut tail = scopeguard(tail);
    // Our own follower: one descriptor, read to EOF, again and again.
    let mut fd = std::fs::File::open(&f).unwrap();
    let mut got = Vec::new();
    let mut steps = std::collections::BTreeSet::new();
    let mut follow = |want: usize| {
        let mut buf = [0u8; 65536];
        loop {
            let n = fd.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        assert!(
            got.len() <= src.len() && got[..] == src[..got.len()],
            "follower read wrong bytes"
        );
        steps.insert(got.len());
        got.len() >= want
    };
    w.write_from(1, &mut follow);
    w.w.ok("exit");
    assert!(
        w.w.wait_exit(Duration::from_secs(5)).is_some(),
        "the writer did not exit"
    );
    wait_for(
        Duration::from_secs(30),
        "the follower to read every byte",
        || follow(src.len()),
    );
    assert!(
        steps.len() >= 5,
        "the follower got everything at once: {steps:?}"
    );
    let st = tail.0.wait().unwrap();
    assert!(st.success());
    let tailed = std::fs::read(&out).unwrap();
    assert_eq!(
        tailed.len(),
        src.len(),
        "tail -f got {} of {} bytes",
        tailed.len(),
        src.len()
    );
    assert!(tailed == src, "tail -f output differs");
}

/// Kills a child we started if the test fails before waiting for it.
struct Guard(Child);
fn scopeguard(c: Child) -> Guard {
    Guard(c)
}
impl Drop for Guard {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            kill(self.0.id(), libc::SIGKILL);
        }
        let _ = self.0.wait();
    }
}

// ---- 5. backpressure -------------------------------------------------------

const SLOW_OPTS: &str = "max_packets_in_flight=4,packet_size=64K";

/// A mount of three datanodes whose second is a slow disk (tools/powercut
/// `slow`): each write there is answered 10 ms late, so a 64 KiB packet (its
/// data and its checksums) is acknowledged 20 ms after it is sent. Bind
/// both (`let (_disk, m)`): the mount goes before the disk.
fn slow_mount() -> (powercut::Disk, Mount) {
    let disk = powercut::Disk::new();
    disk.slow("dn2", 10);
    let dns = vec![disk.beside("dn1"), disk.path("dn2"), disk.beside("dn3")];
    let o = Opts {
        o: vec![SLOW_OPTS.into()],
        ..Opts::default()
    };
    (disk, Mount::with_datanode_paths(o, dns))
}

/// Opens `big` and starts writing 8 MiB to it with one write(2): the
/// agent answers `ok BYTES MS` once the write returned.
fn big_writer(m: &Mount) -> Agent {
    let mut w = Agent::spawn(&m.mnt);
    w.ok("open big wc");
    w.send("burst 8388608 x");
    w
}

/// The seconds a `burst` of 8 MiB took, from its answer.
fn burst_secs(answer: &str) -> f64 {
    match answer.split(' ').collect::<Vec<_>>()[..] {
        ["ok", "8388608", ms] => ms.parse::<f64>().expect("milliseconds") / 1000.0,
        _ => panic!("the 8 MiB write answered `{answer}`"),
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct Stats {
    in_flight: u64,
    peak: u64,
    max: u64,
}

fn stream_stats(m: &Mount, rel: &str) -> Option<Stats> {
    let s = m.xattr(rel, "user.leasefs.stream")?;
    let v: serde_json::Value = serde_json::from_str(s.trim()).ok()?;
    Some(Stats {
        in_flight: v["in_flight"].as_u64()?,
        peak: v["peak_in_flight"].as_u64()?,
        max: v["max_in_flight"].as_u64()?,
    })
}

/// The in-flight bound holds: `write()` blocks once `max_packets_in_flight`
/// packets are sent but unacknowledged, so with a replica that takes 20 ms
/// per packet an 8 MiB write takes about 128 x 20 ms, and the number of
/// packets in flight never goes above the bound (+1 for the packet sealed
/// by the write that reaches it, as docs/SEMANTICS.md states).
#[test]
fn a_slow_replica_makes_write_block_at_the_in_flight_bound() {
    let (_disk, m) = slow_mount();
    let mut w = big_writer(&m);
    let mut seen = Stats::default();
    let mut polls = 0;
    // Polled about every 5 ms while the write is blocked.
    let secs: f64 = loop {
        if let Some(s) = stream_stats(&m, "big") {
            seen.in_flight = seen.in_flight.max(s.in_flight);
            seen.peak = seen.peak.max(s.peak);
            seen.max = s.max;
            polls += 1;
        }
        if let Some(r) = w.reply(Duration::from_millis(5)) {
            break burst_secs(&r);
        }
    };
    // Final statistics while the file is still open.
    let last = stream_stats(&m, "big").expect("stream xattr while open");
    seen.peak = seen.peak.max(last.peak);
    w.ok("close");
    assert_eq!(seen.max, 4, "max_in_flight option not applied");
    assert!(polls > 10, "only {polls} polls");
    assert!(
        secs >= 1.5,
        "an 8 MiB write against a 20 ms/packet replica returned after {secs} s: no backpressure"
    );
    assert!(
        wait_until(Duration::from_secs(5), || m
            .xattr("big", "user.leasefs.stream")
            .is_none()),
        "stream xattr still there after close"
    );
    assert_eq!(m.sh_ok("stat -c %s big"), "8388608\n");
    // docs/SEMANTICS.md "Writing": at most max_packets_in_flight + 1
    // packets are held per stream.
    assert!(
        seen.peak <= seen.max + 1 && seen.in_flight <= seen.max + 1,
        "packets in flight went past the bound max_in_flight + 1 = {}: peak_in_flight {} \
         (largest polled in_flight {}); the kernel sends this write as 1 MiB requests \
         (max_write) = 16 packets of 64 KiB each",
        seen.max + 1,
        seen.peak,
        seen.in_flight,
    );
}

#[test]
fn metadata_operations_are_not_delayed_by_a_writer_blocked_on_a_slow_replica() {
    let (_disk, m) = slow_mount();
    m.sh_ok("mkdir -p pre && echo small > pre/r");
    let mut w = big_writer(&m);
    // Wait until the writer is really blocked on acknowledgements.
    assert!(
        wait_until(Duration::from_secs(10), || stream_stats(&m, "big")
            .is_some_and(|s| s.in_flight >= s.max)),
        "the writer never filled the in-flight window"
    );
    let mut worst = Duration::ZERO;
    for i in 0..20 {
        let t = Instant::now();
        std::fs::create_dir(m.path(&format!("d{i}"))).unwrap();
        let _ = std::fs::metadata(m.path("big")).unwrap();
        let n = std::fs::read_dir(&m.mnt).unwrap().count();
        assert!(n >= 3);
        assert_eq!(std::fs::read(m.path("pre/r")).unwrap(), b"small\n");
        std::fs::rename(m.path(&format!("d{i}")), m.path(&format!("e{i}"))).unwrap();
        worst = worst.max(t.elapsed());
        // The rounds are spread over the blocked write: a workload paced
        // in time.
        let_time_pass(Duration::from_millis(20));
    }
    // All of that happened while the write was still blocked.
    assert!(
        stream_stats(&m, "big").is_some_and(|s| s.in_flight > 0),
        "the writer finished before the metadata operations did"
    );
    let secs = burst_secs(
        &w.reply(Duration::from_secs(60))
            .expect("the 8 MiB write returned"),
    );
    w.ok("close");
    assert!(secs >= 1.5, "the writer was not slowed ({secs} s)");
    assert!(
        worst < Duration::from_millis(250),
        "a round of mkdir/stat/ls/read/rename took {worst:?} while a writer was blocked ({secs} s)"
    );
}

// ---- 6. durability across kill -9 ------------------------------------------

#[test]
fn fsynced_bytes_survive_kill_9_of_the_daemon() {
    let mut m = Mount::with_o("block_size=128K,packet_size=16K");
    let src = pattern(300_000, 6);
    let s = scratch_file(&m, "src", &src);
    let mut w = Agent::spawn(&m.mnt);
    for cmd in [
        "open closed wc",
        &format!("write-from {s} 0 -"),
        "fsync",
        "close",
        "open kept wc",
        &format!("write-from {s} 0 1000"),
        "fsync",
        "close",
    ] {
        w.ok(cmd);
    }
    drop(w);
    m.crash();
    m.mount();
    assert!(
        m.read("closed") == src,
        "fsynced and closed file changed across kill -9"
    );
    assert!(m.read("kept") == src[..1000]);
    assert_eq!(m.sh_ok("stat -c %s closed"), "300000\n");
    assert_eq!(m.lease_state("closed"), "free");
}

#[test]
fn small_files_closed_just_before_kill_9_come_back_whole() {
    // Closed without fsync, each small file's block journaled with its
    // close and its replicas held in memory (no checkpoint runs in ten
    // minutes, no housekeeping listing writes them out): the kill takes
    // the held replicas, and the mount writes them from the journal
    // (docs/SEMANTICS.md, "The block journal"). Over etcd there is no
    // journal (the close writes its replicas): the files come back all
    // the same.
    let journal = !etcd_backend();
    let mut m = Mount::with_o("journal_checkpoint=600,housekeeping_interval=3600");
    m.sh_ok("for i in $(seq 1 20); do seq $i $((i * 300)) > f$i; done");
    let journaled = m.dn_counter("journaled");
    if journal {
        assert!(journaled >= 20, "replicas journaled at close: {journaled}");
        assert_eq!(m.dn_counter("deferred"), journaled, "held in memory");
    }
    m.crash();
    m.mount();
    if journal {
        assert!(
            m.log().contains("block journal replayed"),
            "no replay at mount:\n{}",
            m.log()
        );
        assert_eq!(m.dn_counter("journal_replayed"), journaled);
    }
    for i in 1..=20 {
        let want: String = (i..=i * 300).map(|n| format!("{n}\n")).collect();
        assert!(
            m.read(&format!("f{i}")) == want.as_bytes(),
            "f{i} changed across kill -9"
        );
    }
}

#[test]
fn an_unmount_does_not_wait_for_the_block_journal_window() {
    // A durable small file schedules a checkpoint `journal_checkpoint`
    // later. The unmount checkpoints at once and the daemon exits then,
    // not ten minutes later still holding the data directory (it did).
    let journal = !etcd_backend();
    let mut m = Mount::with_o("journal_checkpoint=600");
    m.sh_ok("seq 1 300 | dd of=f bs=1M iflag=fullblock conv=fsync status=none");
    if journal {
        assert!(m.dn_counter("journaled") >= 1, "the fsync took the journal");
    }
    m.remount_after_a_prompt_unmount_with_no_journal_left();
    let want: String = (1..=300).map(|n| format!("{n}\n")).collect();
    assert!(m.read("f") == want.as_bytes());
}

#[test]
fn small_files_fsynced_and_closed_just_before_kill_9_are_closed_at_the_next_mount() {
    // Each file written, fsynced whole and closed (`dd conv=fsync`): the
    // fsync records block, length and time, and the close makes no
    // commit of its own; the next create's commit carries it, and no
    // other commit, lease-monitor tick or checkpoint comes after the last
    // one before the kill (docs/SEMANTICS.md "Replication and faults", a
    // file that fits in one packet). The daemon reads every file as
    // closed at once (`fsck` lists none open); after the kill the store
    // still has the last file under construction, and the mount's
    // recovery closes it at the length and time its fsync recorded. Over
    // etcd such a close commits at once, under its claim.
    let lazy = !etcd_backend();
    let mut m =
        Mount::with_o("monitor_interval=600,journal_checkpoint=600,housekeeping_interval=3600");
    m.sh_ok(
        "for i in $(seq 1 20); do seq $i $((i * 30)) | dd of=f$i bs=1M iflag=fullblock conv=fsync status=none; done",
    );
    if lazy {
        assert_eq!(m.stats_counter("closes_without_commit"), 20);
    }
    let open = m.fsck(&[]);
    assert_eq!(open.code, 0, "fsck: {}", open.stdout);
    assert!(
        !open.stdout.contains("OPENFORWRITE") && !open.stdout.contains("LEFT OPEN"),
        "closed files listed open: {}",
        open.stdout
    );
    let stat = "stat -c '%n %s %.9Y' f*";
    let before = m.sh_ok(stat);
    m.crash();
    m.mount();
    if lazy {
        assert!(
            m.log()
                .contains("recovering file left open by a previous daemon"),
            "the last close was committed before the kill:\n{}",
            m.log()
        );
    }
    assert_eq!(
        m.sh_ok(stat),
        before,
        "lengths or times changed across kill -9"
    );
    for i in 1..=20 {
        let want: String = (i..=i * 30).map(|n| format!("{n}\n")).collect();
        assert!(
            m.read(&format!("f{i}")) == want.as_bytes(),
            "f{i} changed across kill -9"
        );
        assert_eq!(m.lease_state(&format!("f{i}")), "free");
    }
    let after = m.fsck(&[]);
    assert_eq!(after.code, 0, "fsck after the mount: {}", after.stdout);
    assert!(!after.stdout.contains("OPEN"), "{}", after.stdout);
}

#[test]
fn a_file_open_for_writing_at_kill_9_keeps_its_fsynced_prefix_and_its_lease_is_free() {
    let mut m = Mount::with_o("block_size=128K,packet_size=16K");
    let src = pattern(400_000, 7);
    let synced = 200_000;
    let s = scratch_file(&m, "src", &src);
    let mut w = Agent::spawn(&m.mnt);
    w.ok("open open wc");
    w.ok(&format!("write-from {s} 0 {synced}"));
    w.ok("fsync");
    w.ok(&format!("write-from {s} {synced} -"));
    assert_eq!(m.lease_state("open"), "held");
    m.crash();
    drop(w);
    m.mount();
    let got = m.read("open");
    assert!(
        got.len() >= synced,
        "only {} of {synced} fsynced bytes after kill -9",
        got.len()
    );
    assert!(got.len() <= src.len());
    if let Some(i) = (0..got.len()).find(|&i| got[i] != src[i]) {
        panic!(
            "byte {i} differs after kill -9 (file has {} bytes)",
            got.len()
        );
    }
    assert_eq!(m.sh_ok("stat -c %s open"), format!("{}\n", got.len()));
    assert_eq!(m.lease_state("open"), "free", "lease: {}", m.lease("open"));
    // And it can be written again at once.
    m.sh_ok("printf more >> open");
    let mut want = got.clone();
    want.extend_from_slice(b"more");
    assert!(m.read("open") == want);
}

// ---- 9. umount -------------------------------------------------------------

#[test]
fn plain_umount_unmounts_cleanly_and_a_remount_shows_the_same_tree() {
    let mut m = Mount::new();
    m.sh_ok("mkdir -p d/e && seq 1 20000 > d/e/f && ln -s d/e/f l && ln d/e/f h && echo x > top && mkfifo p");
    let list = "find . -printf '%p %y %s %n %m\\n' | sort; md5sum d/e/f h; readlink l";
    let before = m.sh_ok(list);
    let pid = m.pid.expect("daemon pid");
    let o = Command::new("umount").arg(&m.mnt).output().unwrap();
    assert!(
        o.status.success(),
        "umount failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(!is_mounted(&m.mnt), "still mounted after umount");
    wait_exit(pid, Duration::from_secs(10));
    assert!(!alive(pid), "the daemon did not exit after umount");
    m.pid = None;
    assert!(!m.log().contains("panicked"), "{}", m.log());
    m.mount();
    assert_eq!(m.sh_ok(list), before);
}
