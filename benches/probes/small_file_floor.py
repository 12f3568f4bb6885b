#!/usr/bin/env python3
"""Kernel work per small file, without FUSE: create + 4 KiB + close of one
plain file (what fuse-ceiling stores per file) against one replica in the
HDFS layout leasefs uses (blk_N and blk_N_GS.meta in rbw/, data and
checksums written, both renamed to finalized/), for 1 and 3 replicas. Fresh
directories, nothing deleted until the end (ext4 without a journal makes
creates after many unlinks slow, see benches/README.md).

    benches/probes/small_file_floor.py [DIR] [FILES]   # default /var/tmp 3000
"""
import os, shutil, statistics, sys, tempfile, time

BUF = b"x" * 4096
n = int(sys.argv[2]) if len(sys.argv) > 2 else 3000


def plain(d):
    os.makedirs(d)
    t = time.perf_counter()
    for i in range(n):
        fd = os.open(f"{d}/f{i}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644); os.write(fd, BUF); os.close(fd)
    return (time.perf_counter() - t) / n * 1e6


def hdfs(d, r):
    for k in range(r):
        os.makedirs(f"{d}/dn{k}/rbw"); os.makedirs(f"{d}/dn{k}/finalized")
    t = time.perf_counter()
    for i in range(n):
        for k in range(r):
            p = f"{d}/dn{k}"
            fd = os.open(f"{p}/rbw/blk_{i}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            m = os.open(f"{p}/rbw/blk_{i}_1.meta", os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o644)
            os.pwrite(m, b"LFS1\0\1\2\t", 0); os.pwrite(fd, BUF, 0); os.pwrite(m, b"c" * 32, 8)
            os.close(fd); os.close(m)
            os.rename(f"{p}/rbw/blk_{i}", f"{p}/finalized/blk_{i}")
            os.rename(f"{p}/rbw/blk_{i}_1.meta", f"{p}/finalized/blk_{i}_1.meta")
    return (time.perf_counter() - t) / n * 1e6


base = tempfile.mkdtemp(dir=sys.argv[1] if len(sys.argv) > 1 else "/var/tmp")
try:
    res = {"plain file": [], "1 replica": [], "3 replicas": []}
    for k in range(3):
        res["plain file"].append(plain(f"{base}/p{k}"))
        res["1 replica"].append(hdfs(f"{base}/a{k}", 1))
        res["3 replicas"].append(hdfs(f"{base}/b{k}", 3))
    for key, v in res.items():
        print(f"{key}: {statistics.median(v):.0f} us per file (runs {', '.join(f'{x:.0f}' for x in v)})")
finally:
    shutil.rmtree(base)
