#!/usr/bin/env python3
"""What the disk charges for one durable small file under each layout a
replicated store could use, without FUSE and without leasefs: each turn
writes a 4 KiB file R times (the replicas, in a directory of 3,000
files like `finalized/`), appends 8 KiB to a WAL (the namespace's
commit), and makes all of it durable one way:

  native   one file, its own fsync (what bindfs' backing file costs;
           R is ignored: the yardstick)
  syncfs   data and checksum file per replica, one syncfs(2) covering
           them and the WAL (leasefs today)
  logs     data and checksum file per replica written but not synced;
           the 4 KiB and its checksums appended to a preallocated log
           per datanode; every log and the WAL fdatasync'ed at once
           (the per-datanode intent log proposed in PROFILE.md)
  journal  as logs, but one shared log holding the replicas' records
           and the commit: a single fdatasync (a journaling design
           where metadata and data share one log)

    benches/probes/durable_layouts.py DIR [FILES] [ROUNDS]

Prints the median µs per file for R=1 and R=3, rounds interleaved, and
the syncfs left to make the unsynced replica files durable afterwards
(the write-back a log design pays later), per file. DIR must be on the
disk under test (not tmpfs); it is emptied and removed at the end.
"""
import ctypes, os, shutil, statistics, sys, threading, time

libc = ctypes.CDLL(None, use_errno=True)
base = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 300
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
fin = os.path.join(base, "finalized")
os.makedirs(fin, exist_ok=True)
for i in range(3000):
    open(os.path.join(fin, f"old_{i}"), "w").close()
dfd = os.open(fin, os.O_RDONLY)
LOG = 64 << 20


def prealloc(name):
    fd = os.open(os.path.join(base, name), os.O_RDWR | os.O_CREAT, 0o600)
    os.write(fd, b"\0" * LOG)
    os.fsync(fd)
    return fd


logs = [prealloc(f"log{r}") for r in range(3)]
shared = prealloc("journal")
wal = os.open(os.path.join(base, "wal"), os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
data, sums = b"x" * 4096, b"c" * 40


def at_once(fds):
    ts = [threading.Thread(target=os.fdatasync, args=(fd,)) for fd in fds[1:]]
    for t in ts:
        t.start()
    os.fdatasync(fds[0])
    for t in ts:
        t.join()


def turn(way, r, tag):
    times, off = [], 0
    for i in range(n):
        t0 = time.perf_counter()
        if way == "native":
            fd = os.open(f"{fin}/{tag}_{i}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
            os.write(fd, data)
            os.fsync(fd)
            os.close(fd)
            times.append(time.perf_counter() - t0)
            continue
        for k in range(r):
            for name, body in ((f"blk_{tag}_{k}_{i}", data), (f"blk_{tag}_{k}_{i}.meta", sums)):
                fd = os.open(f"{fin}/{name}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
                os.write(fd, body)
                os.close(fd)
        if way == "syncfs":
            os.write(wal, b"w" * 8192)
            libc.syncfs(dfd)
        elif way == "logs":
            os.write(wal, b"w" * 8192)
            for k in range(r):
                os.pwrite(logs[k], data + sums, off % LOG)
            at_once(logs[:r] + [wal])
        else:  # journal
            os.pwrite(shared, (data + sums) * r + b"w" * 8192, off % LOG)
            os.fdatasync(shared)
        off += 4096 * (r + 3)
        times.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    libc.syncfs(dfd)
    later = (time.perf_counter() - t0) / n
    return statistics.median(times) * 1e6, later * 1e6


def churn():
    """Each benchmark round deletes its files; so does this."""
    for f in os.listdir(fin):
        if not f.startswith("old_"):
            os.unlink(os.path.join(fin, f))


for rnd in range(rounds):
    for r in (1, 3):
        for way in ("native", "syncfs", "logs", "journal"):
            churn()
            med, later = turn(way, r, f"{way}{r}{rnd}")
            print(f"round {rnd} R={r} {way:8} {med:6.0f} µs/file  (syncfs after: {later:4.0f} µs/file)", flush=True)
os.close(dfd)
shutil.rmtree(base)
