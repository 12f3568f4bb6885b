//! Helpers of the storage unit tests: datanodes in temporary directories,
//! replicas written packet by packet, and damage done to replica files.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::api::{ReplicaWrite, Storage};
use super::checksum::ChunkAccumulator;
use super::datanode::Datanode;
use super::layout::DnId;

/// `n` bytes of a pattern that differs with `seed` and along the stream.
pub fn stream(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(37).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

/// Datanode `index` in `DIR/dn<index>`, without an identity file.
pub fn dn(dir: &tempfile::TempDir, index: u32) -> Datanode {
    Datanode::open(DnId(index), &dir.path().join(format!("dn{index}")), None).unwrap()
}

/// Writes `data` to a new rbw replica in packets of the given sizes,
/// syncing after each (as a flush would).
pub fn write_in_packets(dn: &dyn Storage, block: u64, gs: u64, data: &[u8], sizes: &[usize]) {
    let mut w = dn.create_rbw(block, gs).unwrap();
    let mut acc = ChunkAccumulator::new();
    append(&mut *w, &mut acc, data, sizes);
}

/// Appends `data` to `w` in packets of the given sizes (cycled), each
/// synced.
pub fn append(w: &mut dyn ReplicaWrite, acc: &mut ChunkAccumulator, data: &[u8], sizes: &[usize]) {
    let mut crcs = Vec::new();
    let mut i = 0;
    for &n in sizes.iter().cycle() {
        if i >= data.len() {
            break;
        }
        let n = n.min(data.len() - i);
        let off = w.len();
        crcs.clear();
        acc.crcs_for(off, &data[i..i + n], &mut crcs);
        w.write_packet(off, &data[i..i + n], &crcs).unwrap();
        w.sync().unwrap();
        i += n;
    }
}

/// Everything a read of replica `block`@`gs` returns, up to `len` + 100.
pub fn read_all(dn: &dyn Storage, block: u64, gs: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len + 100];
    let n = dn.read(block, gs, 0, &mut buf).unwrap();
    buf.truncate(n);
    buf
}

/// Flips a bit of the byte at `at` of the file at `path`.
pub fn flip_byte(path: &Path, at: u64) {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8];
    f.read_exact_at(&mut b, at).unwrap();
    f.write_all_at(&[b[0] ^ 0x40], at).unwrap();
}

/// The environment variable that tells a test binary run by [`in_child`]
/// that it is the child.
const CHILD: &str = "LEASEFS_TEST_CHILD";

/// Runs the test `name` (its path below the crate, as `--exact` takes it)
/// again in a child process and returns that process's output, when
/// called from the test itself; in the child, returns `None` so that the
/// test goes on with its body. For what belongs to a whole process (a
/// resource limit) or is watched from outside (strace): `wrap` is the
/// command the child runs under (empty: none).
pub fn in_child(name: &str, wrap: &[&str]) -> Option<std::process::Output> {
    if std::env::var_os(CHILD).is_some() {
        return None;
    }
    let exe = std::env::current_exe().unwrap();
    let mut cmd = match wrap.split_first() {
        Some((prog, args)) => {
            let mut c = std::process::Command::new(prog);
            c.args(args).arg(&exe);
            c
        }
        None => std::process::Command::new(&exe),
    };
    let out = cmd
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the child test failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Some(out)
}
