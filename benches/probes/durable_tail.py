#!/usr/bin/env python3
"""durable_tail.py DIR N TAG -- the tail of a durable small file's steps.

N files of create + 4 KiB write + fsync + close in DIR (names TAG-i),
each step timed; prints per step p50, p90, p99, p99.9, the maximum (µs)
and how many took over 1 ms. Run it on each target mounted side by side,
in alternation, after a warm-up of a few hundred files
(benches/PROFILE.md, "fifteenth look": SQLite's checkpoints on the
request threads showed in the create's tail, the block journal's
checkpoint in the fsync's).
"""
import os
import sys
import time

d, n, tag = sys.argv[1], int(sys.argv[2]), sys.argv[3]
steps = [[] for _ in range(4)]
for i in range(n):
    t0 = time.perf_counter()
    fd = os.open(f"{d}/{tag}-{i}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    t1 = time.perf_counter()
    os.write(fd, b"x" * 4096)
    t2 = time.perf_counter()
    os.fsync(fd)
    t3 = time.perf_counter()
    os.close(fd)
    t4 = time.perf_counter()
    for k, v in enumerate((t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
        steps[k].append(v * 1e6)


def pct(a, q):
    return a[min(len(a) - 1, int(q * len(a)))]


for name, a in zip(("create", "write", "fsync", "close"), steps):
    a.sort()
    over = sum(1 for x in a if x > 1000)
    print(
        f"{name:6} p50 {pct(a, .5):6.0f} p90 {pct(a, .9):6.0f} p99 {pct(a, .99):6.0f} "
        f"p99.9 {pct(a, .999):6.0f} max {a[-1]:6.0f}  over 1 ms {over}"
    )
