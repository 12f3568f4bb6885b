#!/usr/bin/env python3
"""What the disk charges for a durable small file, without leasefs: each
turn creates a file, writes 4 KiB to it and appends 4 KiB to a log file
(what leasefs' replica and its metadata store's WAL receive), then makes
them durable one of four ways:

  native      fsync of the file alone (what a plain filesystem does)
  syncfs      one syncfs(2) of the filesystem, covering file and log
              (leasefs' fsync when the WAL is on the datanode's disk)
  both        syncfs and an fdatasync of the log at once (leasefs'
              fsync before it let the syncfs cover the WAL)
  fdatasync2  fdatasync of the file, then of the log

    benches/probes/durable_file_floor.py DIR [FILES]

Prints files/s per way, three rounds interleaved. DIR must be on the
disk under test (not tmpfs).
"""
import ctypes, os, sys, threading, time

libc = ctypes.CDLL(None, use_errno=True)
d = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 300
os.makedirs(d, exist_ok=True)
log = os.open(f"{d}/log", os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o644)
dfd = os.open(d, os.O_RDONLY)


def turn(way, tag):
    t0 = time.perf_counter()
    for i in range(n):
        fd = os.open(f"{d}/{tag}{i}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        os.write(fd, b"x" * 4096)
        os.write(log, b"w" * 4096)
        if way == "native":
            os.fsync(fd)
        elif way == "syncfs":
            libc.syncfs(dfd)
        elif way == "both":
            t = threading.Thread(target=os.fdatasync, args=(log,))
            t.start()
            libc.syncfs(dfd)
            t.join()
        else:
            os.fdatasync(fd)
            os.fdatasync(log)
        os.close(fd)
    return n / (time.perf_counter() - t0)


for r in range(3):
    for way in ["native", "syncfs", "both", "fdatasync2"]:
        print(f"round {r} {way:10} {turn(way, f'{way}{r}-'):6.0f} files/s", flush=True)
