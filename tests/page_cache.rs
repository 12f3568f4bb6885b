//! Reads through the kernel's page cache (docs/SEMANTICS.md, "Page
//! cache"): a file nobody changes is cached and its pages are kept across
//! opens; a reader that opened it before a writer on the same mount never
//! sees a stale zero-filled page, an old byte after a truncation, or a
//! byte past the acknowledged length, through `read` or `mmap`.
//!
//! Several of these fail without the daemon's invalidations: the kernel
//! itself drops only the pages a direct write covers, and grows its file
//! size at each write reply without dropping the page that held the old
//! end of the file.

mod common;
use common::faults::pattern;
use common::*;

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// `n` bytes of a pattern without zero bytes: a zero read back is stale.
fn nonzero(n: usize, seed: u64) -> Vec<u8> {
    pattern(n, seed).into_iter().map(|b| b.max(1)).collect()
}

/// Waits until nobody holds `rel`'s lease (the last writer's RELEASE,
/// which the kernel sends after `close` returned, is in).
fn wait_free(m: &Mount, rel: &str) {
    assert!(
        wait_until(Duration::from_secs(5), || m.lease_state(rel) == "free"),
        "{rel} still held"
    );
}

/// Up to `len` bytes at `off` (fewer at the end of the file).
fn read_at(f: &File, off: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    let mut got = 0;
    while got < len {
        let n = f
            .read_at(&mut buf[got..], off + got as u64)
            .expect("read_at");
        if n == 0 {
            break;
        }
        got += n;
    }
    buf.truncate(got);
    buf
}

/// Bytes of `p` in the kernel's page cache (fincore). fincore maps the
/// file, which drops the pages of a file opened with direct I/O: call it
/// only while nobody writes the file.
fn resident(p: &Path) -> u64 {
    let o = Command::new("fincore")
        .args(["--bytes", "--noheadings", "--raw", "--output", "RES"])
        .arg(p)
        .output()
        .expect("fincore (util-linux) is needed");
    assert!(o.status.success(), "fincore failed: {o:?}");
    String::from_utf8_lossy(&o.stdout)
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("fincore output {o:?}: {e}"))
}

/// The `acked` length of the file's live stream, if a writer has it.
fn acked(p: &Path) -> Option<u64> {
    let s = getxattr(p, "user.leasefs.stream")?;
    let v: serde_json::Value = serde_json::from_str(s.trim()).ok()?;
    v["acked"].as_u64()
}

/// `len` bytes of `f` from offset 0 through a shared read-only mapping.
struct Map {
    ptr: *mut libc::c_void,
    len: usize,
}

impl Map {
    fn new(f: &File, len: usize) -> Map {
        // SAFETY: a fresh read-only shared mapping of an open descriptor;
        // the result is checked.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        assert!(ptr != libc::MAP_FAILED, "mmap failed");
        Map { ptr, len }
    }

    /// Bytes `from..to` of the mapping (all within pages of the file).
    fn bytes(&self, from: usize, to: usize) -> Vec<u8> {
        assert!(from <= to && to <= self.len);
        // SAFETY: inside the mapping, which lives as long as `self`.
        unsafe { std::slice::from_raw_parts((self.ptr as *const u8).add(from), to - from) }.to_vec()
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `new` mapped.
        unsafe {
            libc::munmap(self.ptr, self.len);
        }
    }
}

/// Asserts `got` is `want`, naming the first differing offset.
fn same(got: &[u8], want: &[u8], what: &str) {
    if got == want {
        return;
    }
    let i = (0..got.len().min(want.len()))
        .find(|&i| got[i] != want[i])
        .unwrap_or(got.len().min(want.len()));
    panic!(
        "{what}: {} bytes, expected {}; first difference at {i} (got {:?}, expected {:?})",
        got.len(),
        want.len(),
        got.get(i),
        want.get(i)
    );
}

#[test]
fn a_file_nobody_writes_is_read_through_the_page_cache_and_kept_across_opens() {
    let m = Mount::new();
    let f = m.path("f");
    let src = nonzero(10 * 65536 + 1234, 21);
    std::fs::write(&f, &src).unwrap();
    // Until the writer's RELEASE is in, opens are still direct.
    wait_free(&m, "f");
    same(&m.read("f"), &src, "first read");
    // fincore's open is a second cached open: it keeps the pages.
    let pages = (src.len() as u64).div_ceil(4096) * 4096;
    assert_eq!(resident(&f), pages, "the read did not fill the page cache");
    same(&m.read("f"), &src, "second read");
    assert_eq!(resident(&f), pages);

    // A writer changes the file: the next open drops what was cached.
    let add = nonzero(777, 22);
    let w = OpenOptions::new().append(true).open(&f).unwrap();
    w.write_all_at(&add, src.len() as u64).unwrap();
    drop(w);
    wait_free(&m, "f");
    assert_eq!(resident(&f), 0, "pages of the old content were kept");
    let mut want = src.clone();
    want.extend_from_slice(&add);
    same(&m.read("f"), &want, "read after the append");
}

/// The reader caches the partial last page; the writer's bytes are not
/// acknowledged when its first write returns without this fix (they wait in
/// its packet), so the reader caches that page again, zero-filled past the
/// old end, and the second write's reply makes the kernel believe it.
#[test]
fn a_reader_opened_before_a_writer_never_sees_a_stale_zero_filled_page() {
    let m = Mount::new();
    let f = m.path("f");
    let p = nonzero(40_000, 23);
    std::fs::write(&f, &p[..10_000]).unwrap();
    wait_free(&m, "f");
    let r = File::open(&f).unwrap();
    same(&read_at(&r, 0, 20_000), &p[..10_000], "initial read");
    assert!(resident(&f) > 0, "the reader does not use the page cache");

    let w = OpenOptions::new().write(true).open(&f).unwrap();
    w.write_all_at(&p[10_000..15_000], 10_000).unwrap();
    // Inside the size the write reply gave the kernel: no GETATTR first.
    let got = read_at(&r, 10_000, 100);
    same(&got, &p[10_000..10_000 + got.len()], "read after one write");
    w.write_all_at(&p[15_000..20_000], 15_000).unwrap();
    let got = read_at(&r, 10_000, 6_000);
    same(
        &got,
        &p[10_000..10_000 + got.len()],
        "read after two writes",
    );
    drop(w);

    same(
        &read_at(&r, 10_000, 10_000),
        &p[10_000..20_000],
        "same descriptor after close",
    );
    same(&read_at(&r, 0, 40_000), &p[..20_000], "whole file, same fd");
    let r2 = File::open(&f).unwrap();
    same(&read_at(&r2, 0, 40_000), &p[..20_000], "new descriptor");
    let map = Map::new(&r2, 20_000);
    same(&map.bytes(0, 20_000), &p[..20_000], "mmap");
}

/// A follower with a descriptor opened before the writer (like `tail -f`
/// started on a closed file) reads while the writer appends odd-sized
/// records: never a zero byte, never a byte past the acknowledged length.
#[test]
fn a_cached_follower_never_sees_zeros_or_unacknowledged_bytes_while_a_writer_appends() {
    let m = Mount::new();
    let f = m.path("f");
    let p = Arc::new(nonzero(1_500_000, 24));
    std::fs::write(&f, &p[..5_000]).unwrap();
    wait_free(&m, "f");
    let r = File::open(&f).unwrap();
    same(&read_at(&r, 0, 8_192), &p[..5_000], "initial read");

    let written = Arc::new(AtomicU64::new(5_000));
    let done = Arc::new(AtomicBool::new(false));
    // What the follower has read so far: every 50 writes the writer waits
    // until the follower has caught up, so the follower reads the file
    // while it grows however the threads are scheduled on a loaded machine.
    let caught_up = Arc::new(AtomicU64::new(5_000));
    let writer = {
        let (f, p, written, done, caught_up) = (
            f.clone(),
            p.clone(),
            written.clone(),
            done.clone(),
            caught_up.clone(),
        );
        std::thread::spawn(move || {
            let w = OpenOptions::new().write(true).open(&f).unwrap();
            let mut pos = 5_000usize;
            for i in 0..300usize {
                let n = 1 + (i * 7919) % 4_000;
                w.write_all_at(&p[pos..pos + n], pos as u64).unwrap();
                pos += n;
                written.store(pos as u64, Ordering::SeqCst);
                if i % 50 == 0 {
                    let reached =
                        poll_until(Duration::from_secs(30), Duration::from_millis(1), || {
                            caught_up.load(Ordering::SeqCst) >= pos as u64
                        });
                    assert!(reached, "follower never reached {pos}");
                }
            }
            drop(w);
            done.store(true, Ordering::SeqCst);
            pos
        })
    };
    let mut seen = 5_000usize;
    let mut steps = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let finished = done.load(Ordering::SeqCst);
        // Reads inside and past what the writer has been told is written.
        let known = written.load(Ordering::SeqCst) as usize;
        let got = read_at(&r, seen as u64, known.saturating_sub(seen) + 9_000);
        assert!(
            !got.contains(&0),
            "follower read a zero byte at {}",
            seen + got.iter().position(|&b| b == 0).unwrap()
        );
        same(&got, &p[seen..seen + got.len()], "follower's new bytes");
        if !got.is_empty() {
            seen += got.len();
            caught_up.store(seen as u64, Ordering::SeqCst);
            steps += 1;
            if let Some(a) = acked(&f) {
                assert!(
                    seen as u64 <= a,
                    "follower saw {seen} bytes, only {a} acknowledged"
                );
            }
        }
        // Earlier pages again, around the ends the file had.
        let back = seen.saturating_sub(6_000);
        let again = read_at(&r, back as u64, seen - back);
        same(&again, &p[back..seen], "follower's re-read");
        if finished && seen == written.load(Ordering::SeqCst) as usize {
            break;
        }
        assert!(Instant::now() < deadline, "follower stuck at {seen}");
    }
    let total = writer.join().unwrap();
    assert_eq!(seen, total);
    assert!(steps >= 5, "the follower got everything at once");
    same(&m.read("f"), &p[..total], "whole file");
}

#[test]
fn truncating_and_rewriting_under_a_cached_reader_never_shows_old_bytes() {
    let m = Mount::new();
    let f = m.path("f");
    std::fs::write(&f, vec![b'A'; 200_000]).unwrap();
    wait_free(&m, "f");
    let r = File::open(&f).unwrap();
    same(&read_at(&r, 0, 300_000), &[b'A'; 200_000], "initial read");

    let w = OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&f)
        .unwrap();
    let got = read_at(&r, 0, 300_000);
    assert!(got.is_empty(), "{} bytes after O_TRUNC", got.len());
    w.write_all_at(&[b'B'; 100_000], 0).unwrap();
    // What is acknowledged of the new bytes (all of them, here).
    let got = read_at(&r, 0, 300_000);
    same(
        &got,
        &[b'B'; 100_000][..got.len().min(100_000)],
        "after a rewrite",
    );
    w.write_all_at(&[b'B'; 100_000], 100_000).unwrap();
    let got = read_at(&r, 0, 300_000);
    same(
        &got,
        &[b'B'; 200_000][..got.len().min(200_000)],
        "same size again",
    );

    // Shrink through the writer's own descriptor, then append other bytes.
    w.set_len(50_000).unwrap();
    let got = read_at(&r, 0, 300_000);
    same(&got, &[b'B'; 50_000], "after ftruncate");
    w.write_all_at(&[b'C'; 20_000], 50_000).unwrap();
    let got = read_at(&r, 50_000, 100);
    same(&got, &[b'C'; 100][..got.len()], "after the first append");
    w.write_all_at(&[b'C'; 130_000], 70_000).unwrap();
    drop(w);
    let mut want = vec![b'B'; 50_000];
    want.extend_from_slice(&[b'C'; 150_000]);
    same(&read_at(&r, 0, 300_000), &want, "same descriptor");
    same(&m.read("f"), &want, "new descriptor");
    let map = Map::new(&r, want.len());
    same(&map.bytes(0, want.len()), &want, "mmap");
}

/// A mapping opened while the file is written (direct I/O, whose mmap
/// still uses the page cache) leaves a page zero-filled past the visible
/// end behind; the first cached open after the writer must drop it
/// rather than keep it.
#[test]
fn pages_mapped_during_a_write_are_not_kept_for_later_readers() {
    let m = Mount::new();
    let f = m.path("f");
    let p = nonzero(40_000, 25);
    std::fs::write(&f, &p[..10_000]).unwrap();
    wait_free(&m, "f");
    same(&m.read("f"), &p[..10_000], "initial read");

    let w = OpenOptions::new().write(true).open(&f).unwrap();
    w.write_all_at(&p[10_000..11_000], 10_000).unwrap();
    w.sync_all().unwrap();
    // Written, not yet acknowledged: less than a packet.
    w.write_all_at(&p[11_000..31_000], 11_000).unwrap();
    {
        let r = File::open(&f).unwrap();
        let map = Map::new(&r, 11_000);
        same(
            &map.bytes(0, 11_000),
            &p[..11_000],
            "mapping during the write",
        );
    }
    w.write_all_at(&p[31_000..36_000], 31_000).unwrap();
    drop(w);
    wait_free(&m, "f");
    let r = File::open(&f).unwrap();
    same(
        &read_at(&r, 0, 40_000),
        &p[..36_000],
        "first read after the writer",
    );
}

/// A mapping of a cached file made before an append shows the appended
/// bytes (not the zeros past the old end) once the writer is done.
#[test]
fn a_mapping_of_a_cached_file_follows_an_append() {
    let m = Mount::new();
    let f = m.path("f");
    let p = nonzero(20_000, 26);
    std::fs::write(&f, &p[..10_000]).unwrap();
    wait_free(&m, "f");
    let r = File::open(&f).unwrap();
    let map = Map::new(&r, 12_288);
    same(&map.bytes(0, 10_000), &p[..10_000], "mapping");
    assert!(
        map.bytes(10_000, 12_288).iter().all(|&b| b == 0),
        "past the end of the file a mapped page holds zeros"
    );
    let w = OpenOptions::new().append(true).open(&f).unwrap();
    w.write_all_at(&p[10_000..15_000], 10_000).unwrap();
    drop(w);
    same(
        &map.bytes(0, 12_288),
        &p[..12_288],
        "mapping after the append",
    );
    let map2 = Map::new(&r, 15_000);
    same(&map2.bytes(0, 15_000), &p[..15_000], "new mapping");
}

/// Drops `p`'s pages from the page cache (after writing back any dirty
/// ones, so that they really go), as fio's `--invalidate` does; other
/// tests' pages stay where they are.
fn drop_pages(p: &Path) {
    let f = File::open(p).unwrap();
    f.sync_all().unwrap();
    nix::fcntl::posix_fadvise(
        &f,
        0,
        0,
        nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
    )
    .unwrap();
}

/// The replica data files (not checksums) in datanode `dn`'s `finalized/`.
fn replica_data(dn: &Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dn.join("finalized"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy();
            n.starts_with("blk_") && !n.ends_with(".meta")
        })
        .collect()
}

// A read of replica bytes the page cache does not hold goes to the disk
// past it (`replica_reads=direct`, the default): the bytes read end up
// cached once, as the leasefs file's, where reading through the replica's
// cache held them twice (and, on a VM that hands freed memory back to its
// host, filled twice the fresh pages: benches/PROFILE.md, "Cold reads: the
// bytes cached once"). `replica_reads=cached` keeps the old way.
#[test]
fn a_cold_read_caches_its_bytes_once_unless_replica_reads_cached() {
    const LEN: usize = 6 << 20;
    for (o, direct) in [
        ("replica_reads=direct", true),
        ("replica_reads=cached", false),
    ] {
        let m = Mount::with(Opts {
            datanodes: 1,
            replication: Some(1),
            o: vec![o.to_string()],
            ..Opts::default()
        });
        let src = nonzero(LEN, 31);
        std::fs::write(m.path("f"), &src).unwrap();
        wait_free(&m, "f");
        let data = replica_data(&m.datanodes[0]);
        assert_eq!(data.len(), 1, "{o}: one block, one replica");
        drop_pages(&data[0]);
        drop_pages(&m.path("f"));
        let before = m.dn_counter("reads_direct");
        same(&m.read("f"), &src, o);
        let read_direct = m.dn_counter("reads_direct") - before;
        assert_eq!(resident(&m.path("f")), LEN as u64, "{o}: the file's pages");
        let on_tmpfs = nix::sys::statfs::statfs(&m.datanodes[0])
            .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC);
        if on_tmpfs {
            // A tmpfs file is its pages: nothing to keep out of memory.
            continue;
        }
        let replica = resident(&data[0]);
        if direct {
            assert!(read_direct > 0, "{o}: no replica read went past the cache");
            assert!(
                replica < (LEN / 8) as u64,
                "{o}: {replica} bytes of the replica cached as well"
            );
        } else {
            assert_eq!(read_direct, 0, "{o}: a replica read went past the cache");
            assert!(
                replica >= LEN as u64 / 2,
                "{o}: only {replica} bytes of the replica cached"
            );
        }
    }
}
