//! The filesystem core in process (see `testing`): leases, their limits,
//! recovery and epochs through the same calls the adapter makes, with the
//! clock moved by the test instead of waited for. What only a mount can
//! show (the kernel's caches, real processes contending) is tested in
//! tests/ through FUSE.

use std::time::Duration;

use super::core::{IOC_CLIENT_RENEWAL, IOC_EPOCH, IOC_RENEW};
use super::testing::{TestFs, me};
use crate::config::MountOptions;
use crate::error::FsError;
use crate::lease::{LeaseError, LeaseState};

const APPEND: i32 = libc::O_WRONLY | libc::O_APPEND;

fn opts() -> MountOptions {
    MountOptions {
        soft_limit: Duration::from_secs(60),
        hard_limit: Duration::from_secs(3600),
        ..MountOptions::default()
    }
}

fn is_busy<T: std::fmt::Debug>(r: Result<T, FsError>) -> bool {
    matches!(r, Err(FsError::Lease(LeaseError::Busy { .. })))
}

fn errno<T: std::fmt::Debug>(r: Result<T, FsError>) -> i32 {
    r.expect_err("the request succeeded").errno()
}

#[test]
fn a_second_writer_is_refused_while_the_first_holds_the_lease_and_readers_never_are() {
    let t = TestFs::new(opts(), 2);
    let ino = t.create("f");
    let a = t.open(ino, APPEND, me()).expect("first writer");
    assert!(is_busy(t.open(ino, APPEND, me())), "second writer let in");
    assert_eq!(
        errno(t.open(ino, APPEND | libc::O_NONBLOCK, me())),
        libc::EBUSY
    );
    let r = t.open(ino, libc::O_RDONLY, me()).expect("a reader");
    t.write(a, 0, b"hello").expect("write");
    t.close(a).expect("close");
    assert_eq!(t.read(r, 0, 100).expect("read"), b"hello");
    let b = t
        .open(ino, APPEND, me())
        .expect("the next writer, once released");
    t.close(b).expect("close");
}

#[test]
fn a_client_renewed_lease_is_preempted_after_the_soft_limit_and_its_holder_fenced() {
    let t = TestFs::new(opts(), 3);
    let ino = t.create("f");
    let a = t.open(ino, APPEND, me()).expect("holder");
    t.core.ioctl(a, IOC_CLIENT_RENEWAL).expect("client renewal");
    t.write(a, 0, b"acknowledged").expect("write");
    t.fsync(a).expect("fsync");

    // Renewed, it is kept however long the holder lives.
    for _ in 0..10 {
        t.clock.advance(Duration::from_secs(50));
        t.core.ioctl(a, IOC_RENEW).expect("renew");
    }
    assert!(is_busy(t.open(ino, APPEND, me())));
    // Not renewed for less than the soft limit: still the holder's.
    t.clock.advance(Duration::from_secs(59));
    assert!(is_busy(t.open(ino, APPEND, me())));
    // Past it: another writer recovers the file and gets the lease.
    t.clock.advance(Duration::from_secs(2));
    let b = t.open(ino, APPEND, me()).expect("preempting writer");
    assert_eq!(t.size(ino), 12, "recovery kept what was acknowledged");

    // The stale holder can add nothing, nor renew.
    assert_eq!(errno(t.write(a, 12, b"late")), libc::EIO);
    assert!(t.core.ioctl(a, IOC_RENEW).is_err());
    t.write(b, 12, b", then more").expect("new holder writes");
    t.close(b).expect("close");
    // close(2): its FLUSH fails (the stream did), its RELEASE runs the
    // recovery of a failed stream.
    let flushed = super::testing::wait(|r| t.core.flush(a, me(), r));
    assert_eq!(errno(flushed), libc::EIO);
    super::testing::wait(|r| t.core.release(a, r)).expect("release");
    eprintln!("after release: {:?}", t.core.leases.info(ino));
    assert_eq!(t.size(ino), 23);
}

#[test]
fn the_daemon_renews_ordinary_writers_and_the_hard_limit_recovers_one_it_stopped_renewing() {
    let t = TestFs::new(opts(), 1);
    let ino = t.create("f");
    let a = t.open(ino, APPEND, me()).expect("holder");
    t.write(a, 0, b"data").expect("write");
    t.fsync(a).expect("fsync");

    // The renewal thread (every soft limit / 2) keeps it through hours.
    for _ in 0..(3 * 3600 / 30) {
        t.clock.advance(Duration::from_secs(30));
        t.core.leases.renew_daemon_leases();
        t.monitor_tick();
    }
    assert!(
        t.meta.uc(ino).expect("uc").is_some(),
        "recovered while renewed"
    );

    // Renewals stop (a hung daemon thread, as far as the lease knows):
    // past the soft limit nobody contends, so nothing happens ...
    t.clock.advance(Duration::from_secs(61));
    t.monitor_tick();
    assert!(t.meta.uc(ino).expect("uc").is_some());
    // ... past the hard limit the monitor (ticking every 2 s: it runs,
    // only the renewals stopped) recovers and closes the file.
    for _ in 0..1800 {
        t.clock.advance(Duration::from_secs(2));
        t.monitor_tick();
    }
    t.wait_until("the monitor's recovery is over", || {
        t.core.leases.info(ino).state == LeaseState::Free
    });
    assert!(t.meta.uc(ino).expect("uc").is_none(), "not closed");
    assert_eq!(t.size(ino), 4);
    assert_eq!(errno(t.write(a, 4, b"x")), libc::EIO);
    let b = t.open(ino, APPEND, me()).expect("free again");
    t.close(b).expect("close");
}

#[test]
fn recover_now_closes_a_file_at_its_acknowledged_length() {
    let t = TestFs::new(opts(), 2);
    let ino = t.create("f");
    let a = t.open(ino, APPEND, me()).expect("holder");
    t.write(a, 0, &[7u8; 100_000]).expect("write");
    wait_flush(&t, a);
    assert!(t.core.recover_now(ino).expect("recover"), "not closed");
    assert!(t.meta.uc(ino).expect("uc").is_none());
    assert_eq!(t.size(ino), 100_000);
    assert_eq!(errno(t.write(a, 100_000, b"x")), libc::EIO);
}

fn wait_flush(t: &TestFs, fh: u64) {
    super::testing::wait(|r| t.core.flush(fh, me(), r)).expect("flush");
}

#[test]
fn epochs_rise_with_every_grant_and_across_a_restart() {
    let mut t = TestFs::new(opts(), 1);
    let ino = t.create("f");
    let mut seen = Vec::new();
    for _ in 0..5 {
        let fh = t.open(ino, APPEND, me()).expect("open");
        let e = t.core.ioctl(fh, IOC_EPOCH).expect("epoch");
        seen.push(u64::from_le_bytes(e.try_into().expect("8 bytes")));
        t.close(fh).expect("close");
    }
    // A new daemon on the same store: its epochs start above all of them.
    t.core.persist_epochs();
    let core = t.restart();
    let fh = t.open(ino, APPEND, me()).expect("open after restart");
    let e = core.ioctl(fh, IOC_EPOCH).expect("epoch");
    seen.push(u64::from_le_bytes(e.try_into().expect("8 bytes")));
    t.close(fh).expect("close");
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "epochs {seen:?}");
    assert_eq!(
        core.last_epoch(ino).expect("last"),
        *seen.last().expect("some")
    );
}

/// The kernel sends CREATE only after its lookup found no such name, and
/// skips its own permission check of the open when CREATE succeeds: a
/// name made since (through another daemon) is never opened by CREATE.
/// Without `O_EXCL` the answer is `ESTALE`, on which the kernel looks the
/// name up again and opens the file with its own checks; with `O_EXCL`,
/// `EEXIST`. The file is left as it was, and no lease is taken.
#[test]
fn create_never_opens_a_name_that_exists() {
    use super::testing::{node, wait};
    use crate::meta::{Kind, ROOT_INO};
    let t = TestFs::new(opts(), 1);
    let ino = t.create("secret");
    let a = t.open(ino, APPEND, me()).expect("writer");
    t.write(a, 0, b"root's").expect("write");
    t.close(a).expect("close");
    let nobody = super::core::Caller {
        pid: std::process::id(),
        uid: 65534,
        gid: 65534,
    };
    for (flags, want) in [
        (libc::O_RDWR | libc::O_APPEND | libc::O_CREAT, libc::ESTALE),
        (libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC, libc::ESTALE),
        (libc::O_RDWR | libc::O_CREAT | libc::O_EXCL, libc::EEXIST),
    ] {
        let r = wait(|reply| {
            t.core
                .create(ROOT_INO, b"secret", node(Kind::File), flags, nobody, reply)
        });
        assert_eq!(errno(r), want, "create with flags {flags:o}");
    }
    assert_eq!(t.size(ino), 6, "the file changed");
    assert_eq!(
        t.core.leases.state(ino),
        LeaseState::Free,
        "a lease was taken"
    );
}

/// Over a shared namespace, a recovery is recorded only under this
/// daemon's claim of the file: a writer whose stream failed (not fenced)
/// and whose claim went meanwhile leaves the file to the next claimant,
/// which may be writing it already on another daemon. Recorded anyway, the
/// recovery would cut that writer's blocks to what this daemon saw.
#[test]
fn a_recovery_without_the_files_claim_records_nothing() {
    use super::fake_cluster::FakeCluster;
    use crate::storage::faulty::{Fault, Op};
    let cluster = std::sync::Arc::new(FakeCluster::default());
    let t = TestFs::clustered(opts(), 2, cluster.clone());
    let ino = t.create("f");
    let a = t.open(ino, APPEND, me()).expect("writer");
    t.write(a, 0, b"acknowledged").expect("write");
    t.fsync(a).expect("fsync");
    for f in &t.faults {
        f.arm(Op::Write, Fault::Fail(libc::EIO), 0);
    }
    t.write(a, 12, b" lost").expect("buffered write");
    assert_eq!(errno(t.fsync(a)), libc::EIO, "every replica failed");
    cluster.drop_claim(ino);
    for f in &t.faults {
        f.heal();
    }
    // close(2): its FLUSH fails (the stream did), its RELEASE runs the
    // recovery of a failed stream.
    let flushed = super::testing::wait(|r| t.core.flush(a, me(), r));
    assert_eq!(errno(flushed), libc::EIO);
    super::testing::wait(|r| t.core.release(a, r)).expect("release");
    assert!(
        t.meta.uc(ino).expect("uc").is_some(),
        "recovered without the file's claim"
    );
    assert!(
        matches!(
            t.core
                .recover(ino, crate::lease::RecoveryReason::HolderGone),
            Err(FsError::Lease(LeaseError::Fenced { .. }))
        ),
        "a recovery without the claim must be refused"
    );
    // The next claimant (here this daemon again) recovers it and writes
    // on, once the datanodes are back in service.
    t.core.dns().heartbeat();
    let b = t.open(ino, APPEND, me()).expect("the next writer");
    t.write(b, 12, b", then more").expect("write");
    t.close(b).expect("close");
    assert!(t.meta.uc(ino).expect("uc").is_none());
    let r = t.open(ino, libc::O_RDONLY, me()).expect("reader");
    assert_eq!(t.read(r, 0, 100).expect("read"), b"acknowledged, then more");
}

fn closes_without_commit(t: &TestFs) -> u64 {
    let mut s = crate::metrics::Snapshot::default();
    t.core.ctx.metrics.fill(&mut s);
    s.closes_without_commit
}

/// A small file written, fsynced whole and closed (editors, package
/// managers, git): the fsync records its block, length and time, so the
/// close has only the end of the file's time under construction to
/// record, which waits for the store's next commit (docs/SEMANTICS.md
/// "Replication and faults"). The file reads as closed at once. A close with anything
/// to record since the fsync (a write, a new time) commits as before.
#[test]
fn a_close_after_a_whole_fsync_records_nothing_of_its_own() {
    let t = TestFs::new(opts(), 3);
    let created = t.meta.get(t.create("f")).expect("get").mtime;
    let ino = t.meta.lookup(crate::meta::ROOT_INO, b"f").expect("f").ino;
    std::thread::sleep(Duration::from_millis(2));
    let a = t.open(ino, libc::O_WRONLY, me()).expect("open");
    t.write(a, 0, &[1u8; 4096]).expect("write");
    t.fsync(a).expect("fsync");
    let synced = t.meta.get(ino).expect("get");
    assert_eq!(synced.size, 4096);
    assert!(
        synced.mtime >= created + 1_000_000,
        "the fsync did not record the write's time: {} after {created}",
        synced.mtime
    );
    assert!(t.meta.uc(ino).expect("uc").is_some());
    t.close(a).expect("close");
    assert_eq!(closes_without_commit(&t), 1, "the close committed");
    assert!(t.meta.uc(ino).expect("uc").is_none(), "still open");
    assert!(t.meta.list_uc().expect("list").is_empty());
    assert_eq!(t.meta.get(ino).expect("get").mtime, synced.mtime);
    // Free for the next writer, whose record comes after the close's.
    let b = t.open(ino, APPEND, me()).expect("next writer");
    t.write(b, 4096, b"more").expect("append");
    t.fsync(b).expect("fsync");
    assert!(t.meta.uc(ino).expect("uc").is_some(), "the append's entry");
    t.close(b).expect("close");
    assert!(t.meta.uc(ino).expect("uc").is_none());
    assert_eq!(t.size(ino), 4100);
    assert_eq!(
        closes_without_commit(&t),
        1,
        "an append's close is a commit"
    );

    // A time set between the fsync and the close (cp -p, tar) is kept.
    let g = t.create("g");
    let c = t.open(g, libc::O_WRONLY, me()).expect("open g");
    t.write(c, 0, &[2u8; 100]).expect("write g");
    t.fsync(c).expect("fsync g");
    let set = crate::meta::AttrChange {
        mtime: Some(1_000_000_000),
        ..Default::default()
    };
    t.core.set_attrs(g, set, me()).expect("utimensat");
    t.close(c).expect("close g");
    assert_eq!(closes_without_commit(&t), 1, "a new time went unrecorded");
    assert_eq!(t.meta.get(g).expect("get").mtime, 1_000_000_000);
    assert!(t.meta.uc(g).expect("uc").is_none());
}

/// A small file's fsync whose metadata sync fails (EIO of the WAL, which
/// the block journal makes the block's durability): the fsync fails, the
/// stream with it, and the close that follows reports the failure; it is
/// never a close left for the next commit.
#[test]
fn a_close_after_a_failed_whole_fsync_is_never_left_for_later() {
    let t = TestFs::new(opts(), 3);
    let ino = t.create("f");
    let a = t.open(ino, libc::O_WRONLY, me()).expect("open");
    t.fsync(a).expect("fsync of the entry");
    t.write(a, 0, &[3u8; 4096]).expect("write");
    t.store.fail_syncs(Some(libc::EIO));
    assert_eq!(errno(t.fsync(a)), libc::EIO);
    assert_eq!(errno(t.close(a)), libc::EIO, "the close hid the failure");
    assert_eq!(closes_without_commit(&t), 0);
    // What the failed fsync would have made durable is not kept: a
    // reader sees nothing the store could not vouch for.
    assert_eq!(t.size(ino), 0);
    assert!(t.meta.blocks(ino).expect("blocks").is_empty());
}

/// Over a shared namespace a close commits under the writer's claim,
/// even after a whole fsync: no other daemon could see a removal left in
/// this one's memory, and a daemon whose claim was taken behind its back
/// must learn it from that commit.
#[test]
fn over_a_shared_namespace_a_close_after_a_whole_fsync_commits() {
    use super::fake_cluster::FakeCluster;
    let cluster = std::sync::Arc::new(FakeCluster::default());
    let t = TestFs::clustered(opts(), 2, cluster);
    let ino = t.create("f");
    let a = t.open(ino, libc::O_WRONLY, me()).expect("open");
    t.write(a, 0, &[4u8; 4096]).expect("write");
    t.fsync(a).expect("fsync");
    t.close(a).expect("close");
    assert_eq!(closes_without_commit(&t), 0, "left for later over etcd");
    assert!(t.meta.uc(ino).expect("uc").is_none());
}
