#!/usr/bin/env python3
"""What an fsync of R replicas costs the disk, without leasefs: the median
of 4 KiB append + fdatasync of one file (what a native fsync pays) against
appends to N files (data and checksum file of N/2 replicas) made durable by
one syncfs(2), and by N fdatasyncs in parallel threads.

    benches/probes/sync_cost.py [DIR]     # DIR on the disk to measure, default /var/tmp
"""
import ctypes, os, shutil, sys, tempfile, time
from concurrent.futures import ThreadPoolExecutor

libc = ctypes.CDLL(None, use_errno=True)
BUF = b"x" * 4096
N = 500


def median(ts):
    ts.sort()
    return ts[len(ts) // 2] / 1e3


def fdatasync_one(d):
    fd = os.open(f"{d}/one", os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o644)
    ts = []
    for _ in range(N):
        t = time.perf_counter_ns(); os.write(fd, BUF); os.fdatasync(fd); ts.append(time.perf_counter_ns() - t)
    os.close(fd)
    return median(ts)


def files(d, k):
    return [os.open(f"{d}/f{i}", os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o644) for i in range(k)]


def syncfs_many(d, k):
    fds = files(d, k); ts = []
    for _ in range(N):
        t = time.perf_counter_ns()
        for fd in fds:
            os.write(fd, BUF)
        if libc.syncfs(fds[0]) != 0:
            sys.exit(f"syncfs: errno {ctypes.get_errno()}")
        ts.append(time.perf_counter_ns() - t)
    for fd in fds:
        os.close(fd)
    return median(ts)


def fdatasync_parallel(d, k):
    fds = files(d, k); ts = []
    def one(fd):
        os.write(fd, BUF); os.fdatasync(fd)
    with ThreadPoolExecutor(k) as ex:
        for _ in range(N):
            t = time.perf_counter_ns(); list(ex.map(one, fds)); ts.append(time.perf_counter_ns() - t)
    for fd in fds:
        os.close(fd)
    return median(ts)


base = tempfile.mkdtemp(dir=sys.argv[1] if len(sys.argv) > 1 else "/var/tmp")
try:
    for r in range(3):
        d = f"{base}/{r}"; os.makedirs(d)
        one = fdatasync_one(d)
        s2, s6 = syncfs_many(d, 2), syncfs_many(d, 6)
        p6 = fdatasync_parallel(d, 6)
        print(f"fdatasync of 1 file {one:.0f} us | syncfs of 2 files {s2:.0f} us ({s2 / one:.2f}x)"
              f" | syncfs of 6 files {s6:.0f} us ({s6 / one:.2f}x) | 6 parallel fdatasyncs {p6:.0f} us ({p6 / one:.2f}x)")
finally:
    shutil.rmtree(base)
