//! The object-store datanode (issue 30) against a real S3 store: three
//! Garage nodes with replication 3 (mount-scripts/garage.sh), no mock.
//! In-process: the [`Storage`] implementation itself, as the pipeline,
//! recovery, fsck and housekeeping call it. Skipped, with a message, where
//! Garage is not installed.

mod common;
use common::garage::Garage;

use std::time::Duration;

use leasefs::config::S3Options;
use leasefs::storage::identity::Identity;
use leasefs::storage::s3::{self, ObjectDatanode};
use leasefs::storage::{
    ChunkAccumulator, Datanode, DnId, ReplicaState, ReplicaWrite, Storage, StorageError,
};

fn opts(g: &Garage) -> S3Options {
    S3Options {
        endpoint: Some(g.endpoint.clone()),
        region: Some(g.region.clone()),
        credentials: Some(g.dir().join("env")),
        ..S3Options::default()
    }
}

/// A datanode on `prefix` of the test bucket, as a daemon would open it
/// (its own client: two of these are two hosts).
fn node(g: &Garage, prefix: &str, id: u32) -> ObjectDatanode {
    let url = s3::parse_url(&format!("s3://{}/{prefix}", g.bucket)).expect("url");
    let b = s3::connect(&url, &opts(g)).expect("connect");
    let ident = s3::create_identity(&b, &Identity::new("FS-test")).expect("identity");
    ObjectDatanode::open(DnId(id), b, Some(ident))
}

fn bytes(n: usize, seed: u32) -> Vec<u8> {
    (0..n as u32)
        .map(|i| (i.wrapping_add(seed).wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect()
}

/// Writes `data` at `at` through `w` in packets of `packet` bytes.
fn write(
    w: &mut dyn ReplicaWrite,
    acc: &mut ChunkAccumulator,
    at: u64,
    data: &[u8],
    packet: usize,
) {
    let mut off = at;
    for p in data.chunks(packet) {
        let mut crcs = Vec::new();
        acc.crcs_for(off, p, &mut crcs);
        w.write_packet(off, p, &crcs).expect("write_packet");
        off += p.len() as u64;
    }
}

fn read_all(n: &dyn Storage, block: u64, gs: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len + 100];
    let r = n.open_reader(block, gs).expect("open_reader");
    let mut got = 0;
    while got < buf.len() {
        let k = r.read(got as u64, &mut buf[got..]).expect("read");
        if k == 0 {
            break;
        }
        got += k;
    }
    buf.truncate(got);
    buf
}

#[test]
fn object_datanode_keeps_hdfs_replica_semantics_on_garage() {
    if !Garage::installed() {
        eprintln!("skipped: garage not installed (mount-scripts/garage.sh install)");
        return;
    }
    let g = Garage::start();
    eprintln!("garage.sh up took {:.2} s", g.startup.as_secs_f64());
    write_sync_read_reopen_truncate(&g);
    corruption_is_detected_on_read(&g);
    delete_list_copy_quarantine(&g);
    heartbeat_checks_the_identity(&g);
    requests_per_operation(&g);
    a_new_prefix_gets_one_identity_when_two_daemons_attach_it_at_once(&g);
}

/// What each operation costs in requests (printed; the layout's costs in
/// docs/SEMANTICS.md come from here), with loose bounds asserted.
fn requests_per_operation(g: &Garage) {
    let a = node(g, "t5", 1);
    let req = || a.bucket().requests().snapshot();
    let diff =
        |x: [u64; 5], y: [u64; 5]| -> Vec<u64> { x.iter().zip(y).map(|(a, b)| b - a).collect() };

    // 4 KiB appends, each followed by a sync.
    let mut acc = ChunkAccumulator::new();
    let mut w = a.create_rbw(1, 1).unwrap();
    let data = bytes(4096 * 100, 2);
    let t = std::time::Instant::now();
    let r0 = req();
    let mut lat = Vec::new();
    for (i, p) in data.chunks(4096).enumerate() {
        let t1 = std::time::Instant::now();
        write(&mut *w, &mut acc, (i * 4096) as u64, p, 4096);
        w.sync().unwrap();
        lat.push(t1.elapsed());
    }
    let d = diff(r0, req());
    lat.sort();
    eprintln!(
        "100 x (4 KiB append + sync): requests put/get/list/delete/copy {d:?}; p50 {:?}, p99 {:?}, total {:?}",
        lat[50],
        lat[99],
        t.elapsed()
    );
    assert_eq!(d[0], 100, "one PUT per append, none per sync");
    let r0 = req();
    a.finalize_written(w, 1, 1, data.len() as u64).unwrap();
    eprintln!("finalize of 100 slices (merged): {:?}", diff(r0, req()));

    // 8 MiB in 1 MiB packets, finalized.
    for (packet, block) in [(64 << 10, 2u64), (1 << 20, 3)] {
        let data = bytes(8 << 20, 3);
        let mut acc = ChunkAccumulator::new();
        let t = std::time::Instant::now();
        let r0 = req();
        let mut w = a.create_rbw(block, 1).unwrap();
        write(&mut *w, &mut acc, 0, &data, packet);
        a.finalize_written(w, block, 1, data.len() as u64).unwrap();
        let d = diff(r0, req());
        let secs = t.elapsed().as_secs_f64();
        eprintln!(
            "8 MiB in {} KiB packets, finalized: requests {d:?} ({:.1} per MiB), {:.1} MB/s",
            packet >> 10,
            d.iter().sum::<u64>() as f64 / 8.0,
            8.0 * 1.048576 / secs
        );
        let r0 = req();
        let t = std::time::Instant::now();
        assert_eq!(read_all(&a, block, 1, 8 << 20).len(), 8 << 20);
        eprintln!(
            "  read back: requests {:?}, {:.1} MB/s",
            diff(r0, req()),
            8.0 * 1.048576 / t.elapsed().as_secs_f64()
        );
        // As the kernel reads: 128 KiB at a time, through one reader. The
        // requests are extended to 1 MiB inside the slice (read-ahead).
        let r0 = req();
        let t = std::time::Instant::now();
        let rd = a.open_reader(block, 1).unwrap();
        let mut buf = vec![0u8; 128 << 10];
        let mut got = Vec::with_capacity(8 << 20);
        loop {
            let n = rd.read(got.len() as u64, &mut buf).unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        let d = diff(r0, req());
        eprintln!(
            "  read back in 128 KiB reads: requests {d:?}, {:.1} MB/s",
            8.0 * 1.048576 / t.elapsed().as_secs_f64()
        );
        assert!(got == data, "8 MiB read back in 128 KiB reads");
        // 64 reads, fetched 1 MiB at a time: 2 GETs (CRCs, bytes) per MiB
        // and the first read's own; without read-ahead 128.
        assert!(d[1] <= 2 * 9 + 2, "GETs {d:?}");
    }

    // A small file: one packet at close, straight to finalized.
    let r0 = req();
    let small = bytes(1000, 4);
    let mut crcs = Vec::new();
    leasefs::storage::checksum::chunk_crcs(&small, &mut crcs);
    a.write_finalized(10, 1, &small, &crcs).unwrap();
    let d = diff(r0, req());
    eprintln!("small file (write_finalized): requests {d:?}");
    assert!(d.iter().sum::<u64>() <= 4, "{d:?}");
}

/// Appends (odd sizes, so packets start and end inside chunks) are visible
/// to another host's client as soon as they are written; finalize, restamp
/// and reopen for append, truncation under a new stamp, stale stamps.
fn write_sync_read_reopen_truncate(g: &Garage) {
    let a = node(g, "t1", 1);
    let b = node(g, "t1", 1); // another host's client on the same prefix
    let data = bytes(300_000, 1);
    let mut acc = ChunkAccumulator::new();
    let mut w = a.create_rbw(7, 1).expect("create_rbw");
    write(&mut *w, &mut acc, 0, &data[..100_001], 33_333);
    w.sync().expect("sync");
    // Visible on the other host, being written, before any finalize.
    assert_eq!(read_all(&b, 7, 1, 100_001), data[..100_001]);
    let st = b.stat_replica(7, 1).unwrap();
    assert_eq!((st.state, st.data_len), (ReplicaState::Rbw, 100_001));
    write(&mut *w, &mut acc, 100_001, &data[100_001..200_000], 65_536);
    a.finalize_written(w, 7, 1, 200_000).expect("finalize");
    let st = b.stat_replica(7, 1).unwrap();
    assert_eq!((st.state, st.data_len), (ReplicaState::Finalized, 200_000));
    assert_eq!(read_all(&b, 7, 1, 200_000), data[..200_000]);

    // Append: restamp, reopen at the length, the resume tail is the
    // partial chunk, more appends, finalize.
    a.bump_gs(7, 1, 2).expect("bump");
    a.bump_gs(7, 1, 2).expect("bump again is a no-op");
    assert!(matches!(
        b.open_reader(7, 1),
        Err(StorageError::StaleGenStamp {
            found: 2,
            wanted: 1,
            ..
        })
    ));
    let mut w = a.reopen_rbw(7, 2, 200_000).expect("reopen");
    let tail = w.take_resume_tail();
    assert_eq!(tail, data[200_000 / 512 * 512..200_000]);
    let mut acc = ChunkAccumulator::resume(tail);
    write(&mut *w, &mut acc, 200_000, &data[200_000..], 4096);
    a.finalize_written(w, 7, 2, 300_000).expect("finalize");
    assert_eq!(read_all(&b, 7, 2, 300_000), data);
    assert_eq!(b.valid_prefix(7, 2).unwrap(), 300_000);
    // Many small slices were merged at finalize.
    let objs = a.bucket().list("blk/7").unwrap();
    assert!(objs.len() <= 4, "{objs:?}");

    // Truncation (recovery) to a length inside a chunk, under a new stamp.
    a.truncate(7, 2, 3, 123_457).expect("truncate");
    a.truncate(7, 2, 3, 123_457)
        .expect("truncate again is a no-op");
    assert_eq!(read_all(&b, 7, 3, 300_000), data[..123_457]);
    assert_eq!(b.clean_prefix(7, 3).unwrap(), Some(123_457));
    let info = b.lookup(7).unwrap().expect("lookup");
    assert_eq!((info.gs, info.data_len), (3, 123_457));

    // Pipeline recovery: reopen a replica being written at a shorter
    // acked length, go on writing.
    let mut acc = ChunkAccumulator::new();
    let mut w = a.create_rbw(8, 5).unwrap();
    write(&mut *w, &mut acc, 0, &data[..10_000], 3000);
    drop(w);
    a.bump_gs(8, 5, 6).unwrap();
    let mut w = a.reopen_rbw(8, 6, 7_000).unwrap();
    let mut acc = ChunkAccumulator::resume(w.take_resume_tail());
    write(&mut *w, &mut acc, 7_000, &bytes(5_000, 9), 3000);
    drop(w);
    let mut want = data[..7_000].to_vec();
    want.extend(bytes(5_000, 9));
    assert_eq!(read_all(&b, 8, 6, 12_000), want);
    assert!(matches!(
        a.reopen_rbw(8, 6, 20_000),
        Err(StorageError::TooShort { .. })
    ));
}

/// One byte flipped in a slice object: the read fails with Corrupt at that
/// chunk, the valid prefix stops before it, and clean_prefix calls it damage.
fn corruption_is_detected_on_read(g: &Garage) {
    let a = node(g, "t2", 1);
    let data = bytes(10_000, 3);
    let mut crcs = Vec::new();
    leasefs::storage::checksum::chunk_crcs(&data, &mut crcs);
    a.write_finalized(9, 1, &data, &crcs).unwrap();
    assert_eq!(read_all(&a, 9, 1, 10_000), data);
    let key = a
        .bucket()
        .list("blk/9")
        .unwrap()
        .into_iter()
        .find(|l| l.rel.contains("/s"))
        .expect("a slice")
        .rel;
    let mut obj = a.bucket().get(&key).unwrap().unwrap();
    let at = obj.len() - 10_000 + 5_000; // replica byte 5000, chunk 9
    obj[at] ^= 0x40;
    a.bucket().put(&key, obj).unwrap();
    let mut buf = vec![0u8; 10_000];
    let r = a.open_reader(9, 1).unwrap();
    match r.read(0, &mut buf) {
        Err(StorageError::Corrupt { offset, .. }) => assert_eq!(offset, 9 * 512),
        other => panic!("a corrupt object was served: {other:?}"),
    }
    // Chunks before the bad one still read, also by a sequential reader
    // whose requests are extended over the bad chunk (read-ahead): what
    // was not asked for cannot fail a read.
    assert_eq!(r.read(0, &mut buf[..4608]).unwrap(), 4608);
    let seq = a.open_reader(9, 1).unwrap();
    let mut at = 0;
    for piece in [1024, 1024, 2560] {
        let n = seq.read(at as u64, &mut buf[at..at + piece]).unwrap();
        assert_eq!(n, piece);
        assert_eq!(buf[at..at + piece], data[at..at + piece]);
        at += piece;
    }
    assert!(matches!(
        seq.read(at as u64, &mut buf[at..at + 512]),
        Err(StorageError::Corrupt { .. })
    ));
    assert_eq!(a.valid_prefix(9, 1).unwrap(), 9 * 512);
    assert_eq!(a.clean_prefix(9, 1).unwrap(), None);
}

fn delete_list_copy_quarantine(g: &Garage) {
    let a = node(g, "t3", 1);
    let data = bytes(70_000, 5);
    let mut crcs = Vec::new();
    leasefs::storage::checksum::chunk_crcs(&data, &mut crcs);
    for blk in [1u64, 2, 3] {
        a.write_finalized(blk, 10, &data, &crcs).unwrap();
    }
    let mut ids: Vec<u64> = a.list().unwrap().iter().map(|i| i.block).collect();
    ids.sort();
    assert_eq!(ids, [1, 2, 3]);

    // Copies both ways with a local directory datanode (verified reads).
    let dir = tempfile::tempdir().unwrap();
    let local = Datanode::open(DnId(2), &dir.path().join("dn"), None).unwrap();
    local
        .copy_replica_from(&a, 1, 10, 70_000, ReplicaState::Finalized)
        .unwrap();
    assert_eq!(read_all(&local, 1, 10, 70_000), data);
    a.delete(1).unwrap();
    assert!(a.lookup(1).unwrap().is_none());
    a.copy_replica_from(&local, 1, 10, 60_000, ReplicaState::Finalized)
        .unwrap();
    assert_eq!(read_all(&a, 1, 10, 70_000), data[..60_000]);
    // Never over a newer replica.
    assert!(matches!(
        a.copy_replica_from(&local, 1, 9, 60_000, ReplicaState::Finalized),
        Err(StorageError::NewerReplica { found: 10, .. })
    ));

    // delete_recorded at an older stamp leaves the newer replica.
    a.bump_gs(2, 10, 11).unwrap();
    a.delete_recorded(2, 10).unwrap();
    assert_eq!(a.lookup(2).unwrap().map(|i| i.gs), Some(11));
    a.delete_recorded(2, 11).unwrap();
    assert!(a.lookup(2).unwrap().is_none());

    // Quarantine moves, keeps, lists, expires.
    let to = a.quarantine(3).unwrap();
    assert!(a.lookup(3).unwrap().is_none());
    let q = a.quarantined().unwrap();
    assert_eq!(q.len(), 1);
    assert_eq!((q[0].block, &q[0].path), (3, &to));
    assert_eq!(a.expire_quarantine(Duration::from_secs(3600)).unwrap(), 0);
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(a.expire_quarantine(Duration::ZERO).unwrap(), 1);
    // Garage's listing index is updated after the DELETEs return: looked
    // at again for a few seconds.
    let t = std::time::Instant::now();
    while !a.quarantined().unwrap().is_empty() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "quarantine not emptied"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn heartbeat_checks_the_identity(g: &Garage) {
    let a = node(g, "t4", 1);
    assert!(a.heartbeat().unwrap() > 0);
    // Another datanode's identity object there now: refused.
    let url = s3::parse_url(&format!("s3://{}/t4", g.bucket)).unwrap();
    let b = s3::connect(&url, &opts(g)).unwrap();
    b.delete("VERSION").unwrap();
    s3::create_identity(&b, &Identity::new("FS-other")).unwrap();
    assert!(matches!(
        a.heartbeat(),
        Err(StorageError::OtherIdentity { .. })
    ));
}

/// Two daemons of one filesystem (one namespace: here one SQLite store,
/// across hosts etcd) attach the same empty prefix at the same moment,
/// each with its own client, the second a little later each round (0 to
/// 39 ms), so that one's GET, PUT and read-back fall between the
/// other's. Both must end holding the identity object the store keeps:
/// a daemon holding another storage ID than the object's would fail its
/// heartbeats (`OtherIdentity`), and before that write replicas the
/// registry records under an ID no prefix carries.
fn a_new_prefix_gets_one_identity_when_two_daemons_attach_it_at_once(g: &Garage) {
    use leasefs::meta::{DatanodeRegistry, MetaStore};
    use leasefs::pipeline::attach;
    s3::settings::install(opts(g));
    let t = tempfile::tempdir().unwrap();
    let meta = MetaStore::open(&t.path().join("meta.db"), 0, 0).unwrap();
    let fsid = meta.filesystem_id().unwrap();
    let mut split = Vec::new();
    for round in 0..40u64 {
        let dir = std::path::PathBuf::from(format!("s3://{}/race/{round}", g.bucket));
        let start = std::sync::Barrier::new(2);
        let attach_after = |lag: Duration| {
            start.wait();
            std::thread::sleep(lag);
            attach::create_identity(&meta, &dir, &fsid).expect("create the identity")
        };
        let (a, b) = std::thread::scope(|s| {
            let a = s.spawn(|| attach_after(Duration::ZERO));
            let b = s.spawn(|| attach_after(Duration::from_millis(round)));
            (a.join().unwrap(), b.join().unwrap())
        });
        let url = s3::parse_url(dir.to_str().unwrap()).unwrap();
        let kept = s3::read_identity(&s3::connect(&url, &opts(g)).unwrap())
            .unwrap()
            .expect("an identity object");
        if a != kept || b != kept {
            split.push((round, a.storage_id, b.storage_id, kept.storage_id));
        }
    }
    assert!(
        split.is_empty(),
        "rounds where a daemon holds another identity than the prefix's (round, a, b, kept): {split:?}"
    );
}
