//! Tests of a datanode's replicas through [`super::Storage`]: writes and
//! verified reads, the replica lifecycle (create, reopen, restamp, cut,
//! finalize), and maintenance (listing, deletion, copies, the heartbeat).
//! They live here rather than beside each module because they drive a
//! whole [`super::Datanode`].

mod reader {
    use std::fs::{self, OpenOptions};
    use std::os::unix::fs::FileExt;

    use crate::storage::checksum::{ChunkAccumulator, crc, meta_len_for};
    use crate::storage::layout::meta_name;
    use crate::storage::testkit::{dn, flip_byte, read_all, stream, write_in_packets};
    use crate::storage::{ReplicaState, Storage, StorageError};

    #[test]
    fn write_packets_mid_chunk_after_partial_flush_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let dn = dn(&dir, 0);
        let data = stream(5000, 1);
        write_in_packets(&dn, 7, 1, &data, &[100, 300, 700, 1, 511, 2000, 64]);
        assert_eq!(read_all(&dn, 7, 1, 5000), data);
        // Unaligned ranges, crossing chunk boundaries, and past the end.
        for (off, len) in [
            (0, 1),
            (1, 511),
            (100, 1000),
            (511, 2),
            (1024, 512),
            (4999, 10),
            (3000, 4000),
        ] {
            let mut buf = vec![0u8; len];
            let n = dn.read(7, 1, off as u64, &mut buf).unwrap();
            let want = &data[off.min(5000)..(off + len).min(5000)];
            assert_eq!(&buf[..n], want, "read at {off} len {len}");
        }
        let mut buf = [0u8; 10];
        assert_eq!(dn.read(7, 1, 6000, &mut buf).unwrap(), 0);
        assert_eq!(dn.valid_prefix(7, 1).unwrap(), 5000);
        let meta = dn.dir(ReplicaState::Rbw).join(meta_name(7, 1));
        assert_eq!(fs::metadata(meta).unwrap().len(), meta_len_for(5000));
    }

    #[test]
    fn write_packet_rejects_gaps_and_wrong_crc_count() {
        let dir = tempfile::tempdir().unwrap();
        let dn = dn(&dir, 0);
        let mut w = dn.create_rbw(1, 1).unwrap();
        let data = stream(600, 2);
        let err = w.write_packet(10, &data, &[0, 0]).unwrap_err();
        assert!(matches!(err, StorageError::BadPacket { .. }), "{err}");
        let err = w.write_packet(0, &data, &[0]).unwrap_err();
        assert!(matches!(err, StorageError::BadPacket { .. }), "{err}");
        assert_eq!(w.len(), 0);
        w.write_packet(0, &data, &[crc(&data[..512]), crc(&data[512..])])
            .unwrap();
        assert_eq!(w.len(), 600);
    }

    #[test]
    fn reader_racing_writer_sees_no_false_corruption() {
        // The writer publishes a visible length after each packet (as acks
        // do); a reader reading up to it while the next packet's data is
        // already on disk but its checksums are not must never see Corrupt.
        use crate::sync::{Arc, AtomicBool, AtomicU64, Ordering};
        let dir = tempfile::tempdir().unwrap();
        let dn = Arc::new(dn(&dir, 0));
        let data = Arc::new(stream(200_000, 3));
        let visible = Arc::new(AtomicU64::new(0));
        let done = Arc::new(AtomicBool::new(false));
        let started = Arc::new(AtomicBool::new(false));
        let mut w = dn.create_rbw(1, 1).unwrap();
        let reader = {
            let (dn, data, visible) = (dn.clone(), data.clone(), visible.clone());
            let (done, started) = (done.clone(), started.clone());
            std::thread::spawn(move || {
                started.store(true, Ordering::Release);
                let mut buf = vec![0u8; 4096];
                let mut reads = 0u64;
                while !done.load(Ordering::Acquire) {
                    let v = visible.load(Ordering::Acquire) as usize;
                    let off = v.saturating_sub(700 + reads as usize % 1500);
                    let len = (v - off).min(buf.len());
                    let n = dn.read(1, 1, off as u64, &mut buf[..len]).unwrap();
                    assert_eq!(n, len, "short read at {off} (visible {v})");
                    assert_eq!(&buf[..n], &data[off..off + n]);
                    reads += 1;
                }
                reads
            })
        };
        while !started.load(Ordering::Acquire) {
            std::thread::yield_now();
        }
        let mut acc = ChunkAccumulator::new();
        let mut crcs = Vec::new();
        let mut off = 0;
        for size in [1, 100, 333, 511, 700, 1024, 77].iter().cycle() {
            let n = (*size).min(data.len() - off);
            if n == 0 {
                break;
            }
            crcs.clear();
            acc.crcs_for(off as u64, &data[off..off + n], &mut crcs);
            w.write_packet(off as u64, &data[off..off + n], &crcs)
                .unwrap();
            off += n;
            visible.store(off as u64, Ordering::Release);
            std::thread::yield_now();
        }
        done.store(true, Ordering::Release);
        assert!(reader.join().unwrap() > 0);
    }

    #[test]
    fn reader_of_finalized_replica_survives_append() {
        // `tail -f` while `>>` appends: a reader opened on the finalized
        // replica sees the data grow before its checksums.
        let dir = tempfile::tempdir().unwrap();
        let dn = dn(&dir, 0);
        let data = stream(1000, 14);
        write_in_packets(&dn, 5, 1, &data[..300], &[300]);
        dn.finalize(5, 1, 300).unwrap();
        let reader = dn.open_reader(5, 1).unwrap();
        assert_eq!(reader.state(), ReplicaState::Finalized);
        let _w = dn.reopen_rbw(5, 1, 300).unwrap();
        // The writer's data is on disk, its checksums not yet.
        OpenOptions::new()
            .write(true)
            .open(dn.layout().data_path(ReplicaState::Rbw, 5))
            .unwrap()
            .write_all_at(&data[300..], 300)
            .unwrap();
        let mut buf = vec![0u8; 1000];
        assert_eq!(reader.read(0, &mut buf).unwrap(), 300);
        assert_eq!(&buf[..300], &data[..300]);
    }

    #[test]
    fn finalized_replica_with_short_meta_is_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let dn = dn(&dir, 0);
        write_in_packets(&dn, 5, 1, &stream(2000, 15), &[2000]);
        dn.finalize(5, 1, 2000).unwrap();
        let meta = dn.layout().meta_path(ReplicaState::Finalized, 5, 1);
        OpenOptions::new()
            .write(true)
            .open(&meta)
            .unwrap()
            .set_len(meta_len_for(1024))
            .unwrap();
        let mut buf = vec![0u8; 2000];
        assert!(matches!(
            dn.read(5, 1, 0, &mut buf),
            Err(StorageError::Corrupt { offset: 1024, .. })
        ));
        assert_eq!(dn.read(5, 1, 0, &mut buf[..1024]).unwrap(), 1024);
        assert_eq!(dn.valid_prefix(5, 1).unwrap(), 1024);
    }

    #[test]
    fn corrupt_byte_read_gives_corrupt_and_valid_prefix_stops_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let dn = dn(&dir, 3);
        let data = stream(3000, 4);
        write_in_packets(&dn, 9, 5, &data, &[1000]);
        dn.finalize(9, 5, 3000).unwrap();
        let path = dn.layout().data_path(ReplicaState::Finalized, 9);
        flip_byte(&path, 1500);
        let mut buf = vec![0u8; 100];
        // A read of a byte anywhere in the bad chunk fails...
        match dn.read(9, 5, 1030, &mut buf).unwrap_err() {
            StorageError::Corrupt {
                block,
                replica,
                offset,
            } => {
                assert_eq!((block, offset), (9, 1024));
                assert_eq!(replica, path);
            }
            e => panic!("expected Corrupt, got {e}"),
        }
        // ...reads of other chunks do not.
        assert_eq!(dn.read(9, 5, 0, &mut buf[..]).unwrap(), 100);
        assert_eq!(dn.read(9, 5, 1536, &mut buf[..]).unwrap(), 100);
        assert_eq!(dn.valid_prefix(9, 5).unwrap(), 1024);
        assert_eq!(
            StorageError::Corrupt {
                block: 9,
                replica: path,
                offset: 1024
            }
            .errno(),
            libc::EIO
        );
    }

    /// Drops the page cache of `path` (written out first, so that the
    /// pages are clean and really go).
    fn drop_pages(path: &std::path::Path) {
        let f = fs::File::open(path).unwrap();
        f.sync_all().unwrap();
        nix::fcntl::posix_fadvise(
            &f,
            0,
            0,
            nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
        )
        .unwrap();
    }

    // The request thread's read (issue 28): it serves only bytes whose
    // data and checksums are in memory, and verifies them as every read.
    // A read past the page cache verifies every chunk as any read: a flip
    // on the disk, which no cached page hides, fails it at its chunk; its
    // neighbours still read.
    #[test]
    fn a_read_past_the_page_cache_verifies_every_chunk() {
        let dir = tempfile::tempdir().unwrap();
        let dn = dn(&dir, 3);
        let data = stream(1 << 20, 8);
        write_in_packets(&dn, 5, 1, &data, &[65536]);
        dn.finalize(5, 1, data.len() as u64).unwrap();
        let path = dn.layout().data_path(ReplicaState::Finalized, 5);
        flip_byte(&path, 700_000);
        drop_pages(&path);
        let r = dn.open_reader(5, 1).unwrap();
        let mut buf = vec![0u8; 300_000];
        // Unaligned at both ends, around the flip.
        assert!(matches!(
            r.read_kept(600_001, &mut buf),
            Err(StorageError::Corrupt {
                offset: 699_904,
                ..
            })
        ));
        let mut head = vec![0u8; 99_000];
        assert_eq!(r.read_kept(600_001, &mut head).unwrap(), 99_000);
        assert!(head[..] == data[600_001..699_001]);
        let mut tail = vec![0u8; 400_000];
        assert_eq!(
            r.read_kept(700_417, &mut tail).unwrap(),
            (1 << 20) - 700_417
        );
        assert!(tail[..(1 << 20) - 700_417] == data[700_417..]);
        if nix::sys::statfs::statfs(dir.path())
            .unwrap()
            .filesystem_type()
            != nix::sys::statfs::TMPFS_MAGIC
        {
            assert!(
                dn.io().fast_paths().reads_direct >= 2,
                "read past the cache"
            );
        }
    }

    #[test]
    fn a_read_that_may_not_wait_serves_only_verified_bytes_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        let dn = dn(&dir, 3);
        let data = stream(300_000, 6);
        write_in_packets(&dn, 4, 2, &data, &[65536]);
        dn.finalize(4, 2, data.len() as u64).unwrap();
        let r = dn.open_reader(4, 2).unwrap();
        let mut buf = vec![0u8; 100_000];
        let fs = nix::sys::statfs::statfs(dir.path())
            .unwrap()
            .filesystem_type();
        if fs == nix::sys::statfs::TMPFS_MAGIC {
            // tmpfs refuses `RWF_NOWAIT` (`EOPNOTSUPP`): nothing is served
            // without waiting, every read goes where it may wait.
            assert_eq!(r.read_cached(50_000, &mut buf).unwrap(), None, "tmpfs");
            assert_eq!(dn.io().fast_paths().reads_in_memory, 0);
            return;
        }
        // Just written: in memory.
        assert_eq!(r.read_cached(50_000, &mut buf).unwrap(), Some(100_000));
        assert!(buf[..] == data[50_000..150_000]);
        // Not in memory: not served, nothing waited for.
        let path = dn.layout().data_path(ReplicaState::Finalized, 4);
        let meta = dn.layout().meta_path(ReplicaState::Finalized, 4, 2);
        // `file`'s pages dropped: the read is refused, and a read that may
        // wait (which brings them back) serves it.
        let dropped = |file: &std::path::Path, what: &str, buf: &mut [u8]| {
            drop_pages(file);
            assert_eq!(r.read_cached(50_000, buf).unwrap(), None, "{what} dropped");
            assert_eq!(r.read_kept(50_000, buf).unwrap(), 100_000);
        };
        dropped(&path, "data", &mut buf);
        assert!(buf[..] == data[50_000..150_000]);
        // That read went to the disk past the page cache (`direct`): the
        // data is still not in memory, as it would be after a read through
        // the cache.
        assert_eq!(dn.io().fast_paths().reads_direct, 1, "read direct");
        assert_eq!(r.read_cached(50_000, &mut buf).unwrap(), None, "not cached");
        // A read through the cache brings it back.
        fs::read(&path).unwrap();
        assert_eq!(r.read_cached(50_000, &mut buf).unwrap(), Some(100_000));
        dropped(&meta, "checksums", &mut buf);
        assert_eq!(dn.io().fast_paths().reads_direct, 1, "data was cached");
        // A flip in memory fails the read as any other.
        flip_byte(&path, 120_000);
        assert!(matches!(
            r.read_cached(50_000, &mut buf),
            Err(StorageError::Corrupt {
                offset: 119_808,
                ..
            })
        ));
        assert_eq!(dn.io().fast_paths().reads_in_memory, 2, "the two served");
    }

    #[test]
    fn truncated_data_file_valid_prefix() {
        let dir = tempfile::tempdir().unwrap();
        let dn = dn(&dir, 0);
        let data = stream(3000, 5);
        write_in_packets(&dn, 4, 1, &data, &[3000]);
        let path = dn.layout().data_path(ReplicaState::Rbw, 4);
        let f = OpenOptions::new().write(true).open(&path).unwrap();
        // Cut mid-chunk: that chunk's CRC covers bytes that are gone.
        f.set_len(1300).unwrap();
        assert_eq!(dn.valid_prefix(4, 1).unwrap(), 1024);
        // Cut at a chunk boundary: every remaining chunk is whole.
        f.set_len(1024).unwrap();
        assert_eq!(dn.valid_prefix(4, 1).unwrap(), 1024);
        f.set_len(0).unwrap();
        assert_eq!(dn.valid_prefix(4, 1).unwrap(), 0);
    }

    #[test]
    fn crash_between_data_and_meta_write_keeps_covered_bytes() {
        // The writer writes data, then checksums; a crash in between leaves
        // data no checksum covers. The covered bytes stay valid and
        // readable, the rest is never served.
        let dir = tempfile::tempdir().unwrap();
        let dn = dn(&dir, 0);
        let data = stream(300, 6);
        write_in_packets(&dn, 2, 1, &data, &[300]);
        let path = dn.layout().data_path(ReplicaState::Rbw, 2);
        let f = OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all_at(&stream(900, 9), 300).unwrap();
        assert_eq!(dn.valid_prefix(2, 1).unwrap(), 300);
        assert_eq!(read_all(&dn, 2, 1, 1200), data);
        let mut buf = [0u8; 50];
        assert_eq!(dn.read(2, 1, 100, &mut buf).unwrap(), 50);
        assert_eq!(&buf[..], &data[100..150]);
        // Recovery cuts the replica to the valid prefix.
        dn.truncate(2, 1, 2, 300).unwrap();
        assert_eq!(dn.find(2).unwrap().data_len, 300);
        assert_eq!(dn.valid_prefix(2, 2).unwrap(), 300);
    }

    #[test]
    fn bad_meta_header_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let dn = dn(&dir, 0);
        write_in_packets(&dn, 1, 1, &stream(900, 1), &[900]);
        flip_byte(&dn.layout().meta_path(ReplicaState::Rbw, 1, 1), 0);
        let mut buf = [0u8; 10];
        assert!(matches!(
            dn.read(1, 1, 0, &mut buf),
            Err(StorageError::BadMeta { .. })
        ));
        assert!(matches!(
            dn.valid_prefix(1, 1),
            Err(StorageError::BadMeta { .. })
        ));
    }
}

mod replica {
    use std::fs;

    use crate::storage::checksum::{ChunkAccumulator, meta_len_for};
    use crate::storage::testkit::{append, dn, flip_byte, read_all, stream, write_in_packets};
    use crate::storage::{DnId, ReplicaState, Storage, StorageError};

    #[test]
    fn finalize_moves_files_and_cuts_longer_data() {
        let dir = tempfile::tempdir().unwrap();
        let dn = dn(&dir, 0);
        let data = stream(1200, 7);
        write_in_packets(&dn, 5, 3, &data, &[1200]);
        assert_eq!(dn.find(5).unwrap().state, ReplicaState::Rbw);
        dn.finalize(5, 3, 1000).unwrap();
        assert!(!dn.layout().data_path(ReplicaState::Rbw, 5).exists());
        assert!(!dn.layout().meta_path(ReplicaState::Rbw, 5, 3).exists());
        let info = dn.find(5).unwrap();
        assert_eq!(info.state, ReplicaState::Finalized);
        assert_eq!((info.gs, info.data_len), (3, 1000));
        assert_eq!(
            info.data_path,
            dn.layout().data_path(ReplicaState::Finalized, 5)
        );
        assert_eq!(
            info.meta_path,
            dn.layout().meta_path(ReplicaState::Finalized, 5, 3)
        );
        assert_eq!(
            fs::metadata(&info.meta_path).unwrap().len(),
            meta_len_for(1000)
        );
        assert_eq!(read_all(&dn, 5, 3, 1200), &data[..1000]);
        assert_eq!(dn.valid_prefix(5, 3).unwrap(), 1000);
        // Idempotent; longer than the data is refused.
        dn.finalize(5, 3, 1000).unwrap();
        assert!(matches!(
            dn.finalize(5, 3, 2000),
            Err(StorageError::TooShort {
                len: 1000,
                wanted: 2000,
                ..
            })
        ));
    }

    #[test]
    fn finalize_completes_after_crash_between_renames() {
        let dir = tempfile::tempdir().unwrap();
        let dn = dn(&dir, 0);
        let data = stream(700, 8);
        write_in_packets(&dn, 6, 1, &data, &[700]);
        // Data moved, meta not yet.
        fs::rename(
            dn.layout().data_path(ReplicaState::Rbw, 6),
            dn.layout().data_path(ReplicaState::Finalized, 6),
        )
        .unwrap();
        let info = dn.find(6).unwrap();
        assert_eq!(
            (info.state, info.gs, info.data_len),
            (ReplicaState::Rbw, 1, 700)
        );
        assert_eq!(read_all(&dn, 6, 1, 700), data);
        dn.finalize(6, 1, 700).unwrap();
        assert_eq!(dn.find(6).unwrap().state, ReplicaState::Finalized);
    }

    #[test]
    fn bump_gs_renames_meta_and_old_gs_is_stale() {
        let dir = tempfile::tempdir().unwrap();
        let dn = dn(&dir, 2);
        let data = stream(800, 9);
        let mut w = dn.create_rbw(8, 1).unwrap();
        let mut acc = ChunkAccumulator::new();
        append(&mut *w, &mut acc, &data[..300], &[300]);
        dn.bump_gs(8, 1, 2).unwrap();
        // The open writer keeps writing through its descriptors.
        append(&mut *w, &mut acc, &data[300..], &[500]);
        assert!(!dn.layout().meta_path(ReplicaState::Rbw, 8, 1).exists());
        assert_eq!(dn.find(8).unwrap().gs, 2);
        let mut buf = [0u8; 10];
        assert!(matches!(
            dn.read(8, 1, 0, &mut buf),
            Err(StorageError::StaleGenStamp {
                block: 8,
                found: 2,
                wanted: 1
            })
        ));
        assert!(matches!(
            dn.valid_prefix(8, 1),
            Err(StorageError::StaleGenStamp {
                found: 2,
                wanted: 1,
                ..
            })
        ));
        assert_eq!(read_all(&dn, 8, 2, 800), data);
        // A retried bump is a no-op; a block that is not here is Missing.
        dn.bump_gs(8, 1, 2).unwrap();
        assert!(matches!(
            dn.read(99, 1, 0, &mut buf),
            Err(StorageError::Missing {
                block: 99,
                dn: DnId(2)
            })
        ));
        assert!(matches!(
            dn.bump_gs(99, 1, 2),
            Err(StorageError::Missing { .. })
        ));
    }

    #[test]
    fn truncate_shrink_recomputes_last_chunk_crc() {
        let dir = tempfile::tempdir().unwrap();
        let dn = dn(&dir, 0);
        let data = stream(2000, 10);
        write_in_packets(&dn, 3, 4, &data, &[2000]);
        dn.finalize(3, 4, 2000).unwrap();
        dn.truncate(3, 4, 5, 700).unwrap();
        let info = dn.find(3).unwrap();
        assert_eq!(
            (info.gs, info.data_len, info.state),
            (5, 700, ReplicaState::Finalized)
        );
        assert_eq!(
            fs::metadata(&info.meta_path).unwrap().len(),
            meta_len_for(700)
        );
        assert_eq!(read_all(&dn, 3, 5, 2000), &data[..700]);
        assert_eq!(dn.valid_prefix(3, 5).unwrap(), 700);
        // Retrying is a no-op; growing is refused; a chunk boundary works.
        dn.truncate(3, 4, 5, 700).unwrap();
        assert!(matches!(
            dn.truncate(3, 5, 6, 701),
            Err(StorageError::TooShort { .. })
        ));
        dn.truncate(3, 5, 6, 512).unwrap();
        assert_eq!(read_all(&dn, 3, 6, 700), &data[..512]);
    }

    #[test]
    fn truncate_refuses_to_bless_a_corrupt_last_chunk() {
        let dir = tempfile::tempdir().unwrap();
        let dn = dn(&dir, 0);
        write_in_packets(&dn, 3, 1, &stream(1000, 11), &[1000]);
        flip_byte(&dn.layout().data_path(ReplicaState::Rbw, 3), 600);
        assert!(matches!(
            dn.truncate(3, 1, 2, 700),
            Err(StorageError::Corrupt { offset: 512, .. })
        ));
    }

    #[test]
    fn reopen_rbw_continues_appending() {
        let dir = tempfile::tempdir().unwrap();
        let dn = dn(&dir, 0);
        let data = stream(3000, 12);
        write_in_packets(&dn, 11, 1, &data[..700], &[700]);
        dn.finalize(11, 1, 700).unwrap();
        dn.bump_gs(11, 1, 2).unwrap();
        // A replica that cannot be reopened stays where it was.
        assert!(matches!(
            dn.reopen_rbw(11, 2, 701),
            Err(StorageError::TooShort { .. })
        ));
        assert_eq!(dn.find(11).unwrap().state, ReplicaState::Finalized);
        // Append: the finalized replica goes back to rbw.
        let mut w = dn.reopen_rbw(11, 2, 700).unwrap();
        assert_eq!(w.len(), 700);
        assert_eq!(dn.find(11).unwrap().state, ReplicaState::Rbw);
        let tail = w.take_resume_tail();
        assert_eq!(tail, &data[512..700]);
        let mut acc = ChunkAccumulator::resume(tail);
        append(&mut *w, &mut acc, &data[700..2000], &[100, 900]);
        // Pipeline recovery: reopen an rbw replica at a shorter length.
        drop(w);
        let mut w = dn.reopen_rbw(11, 2, 1800).unwrap();
        let mut acc = ChunkAccumulator::resume(w.take_resume_tail());
        append(&mut *w, &mut acc, &data[1800..], &[333]);
        dn.finalize(11, 2, 3000).unwrap();
        assert_eq!(read_all(&dn, 11, 2, 3000), data);
        assert_eq!(dn.valid_prefix(11, 2).unwrap(), 3000);
    }

    #[test]
    fn finalize_written_moves_an_exact_replica_and_checks_any_other() {
        let dir = tempfile::tempdir().unwrap();
        let dn = dn(&dir, 0);
        let mut w = dn.create_rbw(5, 1).unwrap();
        let mut acc = ChunkAccumulator::new();
        append(&mut *w, &mut acc, &stream(1000, 3), &[1000]);
        dn.finalize_written(w, 5, 1, 1000).unwrap();
        let r = dn.find(5).unwrap();
        assert_eq!(
            (r.state, r.data_len, r.gs),
            (ReplicaState::Finalized, 1000, 1)
        );
        // A shorter length than written: cut to it, as `finalize` does.
        let mut w = dn.create_rbw(6, 1).unwrap();
        let mut acc = ChunkAccumulator::new();
        append(&mut *w, &mut acc, &stream(1000, 4), &[1000]);
        dn.finalize_written(w, 6, 1, 600).unwrap();
        let r = dn.find(6).unwrap();
        assert_eq!((r.state, r.data_len), (ReplicaState::Finalized, 600));
    }

    #[test]
    fn create_rbw_removes_leftovers() {
        let dir = tempfile::tempdir().unwrap();
        let dn = dn(&dir, 0);
        write_in_packets(&dn, 1, 1, &stream(900, 1), &[900]);
        let data = stream(100, 2);
        write_in_packets(&dn, 1, 2, &data, &[100]);
        assert!(!dn.layout().meta_path(ReplicaState::Rbw, 1, 1).exists());
        assert_eq!(read_all(&dn, 1, 2, 900), data);
        dn.finalize(1, 2, 100).unwrap();
        write_in_packets(&dn, 1, 3, &data[..10], &[10]);
        assert_eq!(dn.list().unwrap().len(), 1);
        assert_eq!(read_all(&dn, 1, 3, 900), &data[..10]);
    }
}

mod maintenance {
    use std::fs;

    use crate::storage::identity::{self, Identity};
    use crate::storage::layout::{DnId, meta_name};
    use crate::storage::testkit::{dn, flip_byte, read_all, stream, write_in_packets};
    use crate::storage::{Datanode, ReplicaState, Storage, StorageError};

    #[test]
    fn copy_replica_from_copies_prefix_and_replaces_stale_replica() {
        let dir = tempfile::tempdir().unwrap();
        let src = dn(&dir, 0);
        let dst = dn(&dir, 1);
        let data = stream(1300, 13);
        write_in_packets(&src, 12, 3, &data, &[1300]);
        // A stale replica of the same block on the destination.
        write_in_packets(&dst, 12, 1, &stream(50, 0), &[50]);
        dst.copy_replica_from(&src, 12, 3, 1000, ReplicaState::Finalized)
            .unwrap();
        let info = dst.find(12).unwrap();
        assert_eq!(
            (info.gs, info.data_len, info.state),
            (3, 1000, ReplicaState::Finalized)
        );
        assert!(!dst.layout().meta_path(ReplicaState::Rbw, 12, 1).exists());
        assert!(!dst.layout().data_path(ReplicaState::Rbw, 12).exists());
        assert_eq!(read_all(&dst, 12, 3, 1300), &data[..1000]);
        assert_eq!(dst.valid_prefix(12, 3).unwrap(), 1000);
        assert_eq!(fs::read_dir(dst.root().join("tmp")).unwrap().count(), 0);
        // Too long a copy, or a corrupt source, fails and leaves no temp files.
        assert!(matches!(
            dst.copy_replica_from(&src, 12, 3, 2000, ReplicaState::Rbw),
            Err(StorageError::TooShort {
                len: 1300,
                wanted: 2000,
                ..
            })
        ));
        flip_byte(&src.layout().data_path(ReplicaState::Rbw, 12), 10);
        assert!(matches!(
            dst.copy_replica_from(&src, 12, 3, 1000, ReplicaState::Rbw),
            Err(StorageError::Corrupt { offset: 0, .. })
        ));
        assert_eq!(fs::read_dir(dst.root().join("tmp")).unwrap().count(), 0);
        assert_eq!(read_all(&dst, 12, 3, 1300), &data[..1000]);
    }

    #[test]
    fn copy_replica_from_never_replaces_a_newer_replica() {
        let dir = tempfile::tempdir().unwrap();
        let src = dn(&dir, 0);
        let dst = dn(&dir, 1);
        write_in_packets(&src, 12, 3, &stream(1000, 13), &[1000]);
        src.finalize(12, 3, 1000).unwrap();
        // A writer reopened the block on the destination at stamp 4.
        let live = stream(1500, 7);
        write_in_packets(&dst, 12, 4, &live, &[1500]);
        assert!(matches!(
            dst.copy_replica_from(&src, 12, 3, 1000, ReplicaState::Finalized),
            Err(StorageError::NewerReplica {
                found: 4,
                copying: 3,
                ..
            })
        ));
        assert_eq!(read_all(&dst, 12, 4, 1500), live);
        assert_eq!(fs::read_dir(dst.root().join("tmp")).unwrap().count(), 0);
    }

    #[test]
    fn list_reports_every_complete_replica() {
        let dir = tempfile::tempdir().unwrap();
        let dn = dn(&dir, 0);
        write_in_packets(&dn, 30, 1, &stream(10, 1), &[10]);
        write_in_packets(&dn, 20, 2, &stream(600, 1), &[600]);
        dn.finalize(20, 2, 600).unwrap();
        write_in_packets(&dn, 10, 5, &stream(0, 1), &[1]);
        // Junk and half replicas are not listed.
        fs::write(dn.dir(ReplicaState::Rbw).join("notes.txt"), b"x").unwrap();
        fs::write(dn.dir(ReplicaState::Rbw).join("blk_40"), b"x").unwrap();
        fs::write(dn.dir(ReplicaState::Finalized).join(meta_name(50, 1)), b"x").unwrap();
        let got: Vec<_> = dn
            .list()
            .unwrap()
            .into_iter()
            .map(|r| (r.block, r.gs, r.state, r.data_len))
            .collect();
        assert_eq!(
            got,
            vec![
                (10, 5, ReplicaState::Rbw, 0),
                (20, 2, ReplicaState::Finalized, 600),
                (30, 1, ReplicaState::Rbw, 10),
            ]
        );
        dn.delete(20).unwrap();
        dn.delete(20).unwrap();
        assert!(dn.find(20).is_none());
        assert_eq!(dn.list().unwrap().len(), 2);
    }

    #[test]
    fn delete_recorded_removes_both_files_and_falls_back_on_another_gs() {
        let dir = tempfile::tempdir().unwrap();
        let dn = dn(&dir, 0);
        write_in_packets(&dn, 7, 3, &stream(700, 1), &[700]);
        dn.finalize(7, 3, 700).unwrap();
        write_in_packets(&dn, 8, 4, &stream(100, 2), &[100]);
        dn.delete_recorded(7, 3).unwrap();
        assert!(dn.find(7).is_none());
        // Recorded at an older stamp than the meta file's: found by listing.
        dn.delete_recorded(8, 2).unwrap();
        assert!(dn.find(8).is_none());
        assert!(dn.list().unwrap().is_empty());
        for s in ReplicaState::ALL {
            assert_eq!(fs::read_dir(dn.dir(s)).unwrap().count(), 0);
        }
    }

    #[test]
    fn heartbeat_probes_and_reports_free_space() {
        let dir = tempfile::tempdir().unwrap();
        let dn = dn(&dir, 0);
        assert!(dn.heartbeat().unwrap() > 0);
        assert_eq!(fs::read_dir(dn.root().join("tmp")).unwrap().count(), 0);
        // A datanode whose directory is gone fails its heartbeat.
        fs::remove_dir_all(dn.root()).unwrap();
        assert!(matches!(dn.heartbeat(), Err(StorageError::Io { .. })));
    }

    #[test]
    fn heartbeat_checks_the_identity_file_and_restores_it_in_a_recreated_directory() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("dn");
        fs::create_dir_all(&root).unwrap();
        let me = identity::create(&root, &Identity::new("FS-1")).unwrap();
        let dn = Datanode::open(DnId(4), &root, Some(me.clone())).unwrap();
        dn.heartbeat().unwrap();
        // Emptied and recreated by the operator: the same storage again.
        fs::remove_dir_all(&root).unwrap();
        fs::create_dir_all(&root).unwrap();
        dn.heartbeat().unwrap();
        assert_eq!(identity::read(&root).unwrap(), Some(me.clone()));
        // Another datanode's directory mounted at the same path is not it.
        fs::remove_dir_all(&root).unwrap();
        fs::create_dir_all(&root).unwrap();
        identity::create(&root, &Identity::new("FS-1")).unwrap();
        assert!(matches!(
            dn.heartbeat(),
            Err(StorageError::OtherIdentity { .. })
        ));
    }
}

mod zero_fill {
    use std::fs;

    use crate::storage::checksum::{ChunkAccumulator, meta_len_for};
    use crate::storage::testkit::{dn, read_all, stream};
    use crate::storage::{ReplicaState, ReplicaWrite, Storage, SyncPlan};

    /// Appends `data` to `w` in one packet, without syncing.
    fn put(w: &mut dyn ReplicaWrite, acc: &mut ChunkAccumulator, data: &[u8]) {
        let mut crcs = Vec::new();
        let off = w.len();
        acc.crcs_for(off, data, &mut crcs);
        w.write_packet(off, data, &crcs).unwrap();
    }

    fn plan(w: &mut dyn ReplicaWrite) -> &'static str {
        match w.begin_sync(true).unwrap() {
            SyncPlan::Clean => "clean",
            SyncPlan::Ranged => "ranged",
            SyncPlan::Full(tasks) => {
                for t in tasks {
                    t.run().unwrap();
                }
                "full"
            }
        }
    }

    #[test]
    fn syncs_inside_the_zero_filled_stretch_are_ranged_and_the_rest_full() {
        let dir = tempfile::tempdir().unwrap();
        let dn = dn(&dir, 0);
        assert!(
            dn.ranged_sync(),
            "the test directory is on ext4, xfs or tmpfs"
        );
        let mut w = dn.create_rbw(1, 1).unwrap();
        let mut acc = ChunkAccumulator::new();
        let data = stream(12_000, 3);
        // Before its files' names are durable a replica's sync is full.
        put(&mut *w, &mut acc, &data[..1000]);
        assert_eq!(plan(&mut *w), "full");
        w.synced();
        assert_eq!(plan(&mut *w), "clean");
        w.extend_zeroed(8192).unwrap();
        assert_eq!(w.zeroed(), 8192);
        let l = dn.layout();
        let (data_path, meta_path) = (
            l.data_path(ReplicaState::Rbw, 1),
            l.meta_path(ReplicaState::Rbw, 1, 1),
        );
        assert_eq!(fs::metadata(&data_path).unwrap().len(), 8192);
        assert_eq!(fs::metadata(&meta_path).unwrap().len(), meta_len_for(8192));
        // Appends inside the stretch: ranged, one cache flush.
        put(&mut *w, &mut acc, &data[1000..5000]);
        assert_eq!(plan(&mut *w), "ranged");
        w.end_ranged().unwrap();
        w.flush().unwrap();
        w.synced();
        // The files keep their size; the checksums say where the data ends,
        // for readers and for recovery.
        assert_eq!(fs::metadata(&data_path).unwrap().len(), 8192);
        assert_eq!(read_all(&dn, 1, 1, 5000), &data[..5000]);
        assert_eq!(dn.valid_prefix(1, 1).unwrap(), 5000);
        // Past it: a full sync again (the files grow).
        put(&mut *w, &mut acc, &data[5000..12_000]);
        assert_eq!(plan(&mut *w), "full");
        w.synced();
        assert_eq!(w.zeroed(), 12_000);
        // Finishing cuts the zeros: a finalized replica is as long as its data.
        let len = w.finish().unwrap();
        assert_eq!(len, 12_000);
        assert_eq!(fs::metadata(&data_path).unwrap().len(), 12_000);
        assert_eq!(
            fs::metadata(&meta_path).unwrap().len(),
            meta_len_for(12_000)
        );
    }

    /// Writes the zero fill cannot finish still leave the files longer
    /// than the data, and finishing the replica cuts them (a finalized
    /// replica is exactly as long as its data). In a child process: the
    /// limit on file size (which makes the fill fail part way) is the
    /// whole process's.
    #[test]
    fn a_zero_fill_that_fails_part_way_is_cut_when_the_replica_is_finished() {
        const NAME: &str = "storage::tests::zero_fill::a_zero_fill_that_fails_part_way_is_cut_when_the_replica_is_finished";
        if crate::storage::testkit::in_child(NAME, &[]).is_some() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let dn = dn(&dir, 0);
        let mut w = dn.create_rbw(3, 1).unwrap();
        let mut acc = ChunkAccumulator::new();
        let data = stream(100_000, 7);
        put(&mut *w, &mut acc, &data);
        w.sync().unwrap();
        // Files may not grow past 300,000 bytes: the data file's zeros stop
        // there (EFBIG), its checksums get none.
        // SAFETY: setting the handler of a signal to SIG_IGN runs no code
        // of ours.
        unsafe {
            nix::sys::signal::signal(
                nix::sys::signal::Signal::SIGXFSZ,
                nix::sys::signal::SigHandler::SigIgn,
            )
            .unwrap();
        }
        let limit = libc::rlimit {
            rlim_cur: 300_000,
            rlim_max: 300_000,
        };
        // SAFETY: a plain system call reading a struct that lives across it.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_FSIZE, &limit) }, 0);
        assert!(w.extend_zeroed(1 << 20).is_err());
        let data_path = dn.layout().data_path(ReplicaState::Rbw, 3);
        assert!(fs::metadata(&data_path).unwrap().len() > 100_000);
        assert_eq!(w.zeroed(), 100_000, "no stretch is taken for zero-filled");
        let len = w.finish().unwrap();
        assert_eq!(len, 100_000);
        assert_eq!(fs::metadata(&data_path).unwrap().len(), 100_000);
        dn.finalize(3, 1, 100_000).unwrap();
        assert_eq!(dn.stat_replica(3, 1).unwrap().data_len, 100_000);
        assert_eq!(read_all(&dn, 3, 1, 100_000), data);
    }

    /// Bytes written over a zero-filled stretch are overwrites of blocks
    /// the files already have: a filesystem may write them back after a
    /// later change of the files' size (a journaled truncation reaches the
    /// disk on its own schedule). So a zero-filled replica is synced before
    /// it is cut, wherever it is cut: at its close, when it is reopened
    /// (pipeline recovery) and when it is truncated (lease recovery);
    /// otherwise a power cut could keep the cut and lose the bytes below
    /// it, a replica of the right length with zeros inside. Watched with
    /// strace, in a child process.
    #[test]
    fn a_zero_filled_replica_is_synced_before_it_is_cut() {
        const NAME: &str =
            "storage::tests::zero_fill::a_zero_filled_replica_is_synced_before_it_is_cut";
        let wrap = [
            "strace",
            "-f",
            "-y",
            "-qq",
            "-e",
            "trace=pwrite64,fdatasync,fsync,ftruncate",
        ];
        if let Some(out) = crate::storage::testkit::in_child(NAME, &wrap) {
            let trace = String::from_utf8_lossy(&out.stderr);
            for file in [
                "rbw/blk_4>",
                "rbw/blk_4_1.meta>",
                "rbw/blk_5>",
                "rbw/blk_5_1.meta>",
            ] {
                synced_before_each_cut(&trace, file);
            }
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let dn = dn(&dir, 0);
        let data = stream(9000, 8);
        // Closed: finishing the writer cuts the zeros.
        let mut w = dn.create_rbw(4, 1).unwrap();
        let mut acc = ChunkAccumulator::new();
        put(&mut *w, &mut acc, &data[..1000]);
        w.sync().unwrap();
        w.extend_zeroed(1 << 20).unwrap();
        put(&mut *w, &mut acc, &data[1000..]);
        assert_eq!(w.finish().unwrap(), 9000);
        // Reopened by pipeline recovery, and truncated by lease recovery,
        // after the daemon died with appends not synced.
        let mut w = dn.create_rbw(5, 1).unwrap();
        let mut acc = ChunkAccumulator::new();
        put(&mut *w, &mut acc, &data[..1000]);
        w.sync().unwrap();
        w.extend_zeroed(1 << 20).unwrap();
        put(&mut *w, &mut acc, &data[1000..]);
        drop(w);
        drop(dn.reopen_rbw(5, 1, 8000).unwrap());
        dn.truncate(5, 1, 1, 7000).unwrap();
    }

    /// In `trace` (strace -y), every `ftruncate` of `file` that follows
    /// writes to it has an `fdatasync` or `fsync` of it in between.
    fn synced_before_each_cut(trace: &str, file: &str) {
        let mut dirty = false;
        let mut cuts = 0;
        for line in trace.lines().filter(|l| l.contains(file)) {
            if line.contains("pwrite64(") {
                dirty = true;
            } else if line.contains("fdatasync(") || line.contains("fsync(") {
                dirty = false;
            } else if line.contains("ftruncate(") {
                cuts += 1;
                assert!(!dirty, "{file} cut with writes not synced:\n{trace}");
            }
        }
        assert!(cuts > 0, "{file} never cut:\n{trace}");
    }

    /// After a sync that ended inside a chunk, an append rewrites that
    /// chunk's checksum in place. A power cut that kept the new checksum
    /// and lost the appended bytes leaves a chunk that matches neither;
    /// the sync note vouches for the synced part of it, so the replica's
    /// valid prefix (what recovery keeps) is never below the sync, and the
    /// cut to it goes through.
    #[test]
    fn a_checksum_that_reached_the_disk_before_its_bytes_costs_no_synced_byte() {
        for zero_filled in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let dn = dn(&dir, 0);
            let mut w = dn.create_rbw(6, 1).unwrap();
            let mut acc = ChunkAccumulator::new();
            let data = stream(1100, 9);
            put(&mut *w, &mut acc, &data[..1000]);
            w.sync().unwrap();
            if zero_filled {
                w.extend_zeroed(1 << 20).unwrap();
            }
            put(&mut *w, &mut acc, &data[1000..]);
            drop(w);
            // The cut: the appended bytes never reached the disk.
            let path = dn.layout().data_path(ReplicaState::Rbw, 6);
            let f = fs::OpenOptions::new().write(true).open(&path).unwrap();
            std::os::unix::fs::FileExt::write_all_at(&f, &[0u8; 100], 1000).unwrap();
            assert_eq!(
                dn.valid_prefix(6, 1).unwrap(),
                1000,
                "zero-filled: {zero_filled}"
            );
            assert_eq!(dn.clean_prefix(6, 1).unwrap(), Some(1000));
            dn.truncate(6, 1, 2, 1000).unwrap();
            assert_eq!(read_all(&dn, 6, 2, 1000), &data[..1000]);
            assert_eq!(dn.valid_prefix(6, 2).unwrap(), 1000);
        }
    }

    /// The same after a truncation to inside a chunk (no writer's sync
    /// ended there, so no sync note did): reopening the replica for append
    /// leaves a durable note of the chunk as it is before the append can
    /// rewrite its checksum. Found by the power-cut rounds on ext4, with a
    /// cut that kept a random subset of the pending sectors.
    #[test]
    fn a_truncation_inside_a_chunk_then_an_append_costs_no_byte_of_the_truncated_file() {
        let dir = tempfile::tempdir().unwrap();
        let dn = dn(&dir, 0);
        let mut w = dn.create_rbw(6, 1).unwrap();
        let mut acc = ChunkAccumulator::new();
        let data = stream(1300, 9);
        put(&mut *w, &mut acc, &data);
        w.sync().unwrap();
        drop(w);
        dn.truncate(6, 1, 2, 1000).unwrap();
        let mut w = dn.reopen_rbw(6, 2, 1000).unwrap();
        let mut acc = ChunkAccumulator::resume(data[512..1000].to_vec());
        let more = stream(100, 10);
        put(&mut *w, &mut acc, &more);
        drop(w);
        // The cut: the new checksum reached the disk, the bytes did not.
        let path = dn.layout().data_path(ReplicaState::Rbw, 6);
        let f = fs::OpenOptions::new().write(true).open(&path).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, &[0u8; 100], 1000).unwrap();
        assert_eq!(dn.valid_prefix(6, 2).unwrap(), 1000);
    }

    #[test]
    fn a_zero_filled_replica_left_by_a_crash_is_recovered_to_its_data() {
        let dir = tempfile::tempdir().unwrap();
        let dn = dn(&dir, 0);
        let mut w = dn.create_rbw(2, 5).unwrap();
        let mut acc = ChunkAccumulator::new();
        // Ends inside a chunk, so the chunk holds data then zeros.
        let data = stream(3000, 4);
        put(&mut *w, &mut acc, &data[..100]);
        w.sync().unwrap();
        w.extend_zeroed(1 << 20).unwrap();
        put(&mut *w, &mut acc, &data[100..]);
        w.sync().unwrap();
        drop(w); // the daemon dies: nothing cuts the zeros
        assert_eq!(dn.valid_prefix(2, 5).unwrap(), 3000);
        // A lost tail is told from damage by what is present: zeros whose
        // checksum slots are zero too are not.
        assert_eq!(dn.clean_prefix(2, 5).unwrap(), Some(3000));
        assert_eq!(read_all(&dn, 2, 5, 3000), data);
        // Recovery cuts it to the agreed length, and the zeros go with it.
        dn.truncate(2, 5, 6, 2500).unwrap();
        assert_eq!(dn.stat_replica(2, 6).unwrap().data_len, 2500);
        assert_eq!(dn.valid_prefix(2, 6).unwrap(), 2500);
        // So does reopening it for append.
        let w = dn.reopen_rbw(2, 6, 2000).unwrap();
        assert_eq!(w.len(), 2000);
        assert_eq!(dn.stat_replica(2, 6).unwrap().data_len, 2000);
    }
}
