#!/usr/bin/env python3
"""benches/many_files.py: the work behind benches/run.sh's many-file rows.

    many_files.py archive TAR NDIRS FILES_PER_DIR
        writes TAR, a tar archive of tree/dNNN/fNNNN: NDIRS directories of
        FILES_PER_DIR files each, sizes 1-8 KiB (seeded, so every run gets
        the same tree). Built in memory: no file is made or deleted on the
        disk for it.
    many_files.py entries DIR N
        makes N empty files e0000000.. in DIR (mknod, or create + close where
        mknod is refused; four threads) and prints how many it made.
    many_files.py writers DIR PREFIX FILES CONCURRENCY
        FILES writers, processes forked from this one, each making one file
        of 1 MiB (create, one 1 MiB write, close), CONCURRENCY of them at a
        time (the first released together, each next one as soon as one
        ends); prints the aggregate MB/s (10^6 bytes) from the release to
        the last close, after checking (untimed) that every file holds
        1 MiB.

Any failure exits non-zero with a message on stderr (run.sh then records NA).
"""

import errno
import gc
import io
import os
import random
import signal
import sys
import tarfile
import threading
import time

MIB = 1 << 20


def archive(path, ndirs, per_dir):
    rng = random.Random(17)
    now = int(time.time())
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:

        def add_dir(name):
            ti = tarfile.TarInfo(name)
            ti.type, ti.mode, ti.mtime = tarfile.DIRTYPE, 0o755, now
            tar.addfile(ti)

        add_dir("tree")
        for d in range(ndirs):
            add_dir(f"tree/d{d:03d}")
            for f in range(per_dir):
                data = rng.randbytes(rng.randint(1024, 8192))
                ti = tarfile.TarInfo(f"tree/d{d:03d}/f{f:04d}")
                ti.size, ti.mode, ti.mtime = len(data), 0o644, now
                tar.addfile(ti, io.BytesIO(data))
    print(ndirs * per_dir)


def entries(d, n, nthreads=4):
    """Untimed, so made by a few threads at once (a FUSE daemon serves
    several requests at a time): the full directory is ready sooner."""
    errors = []

    def make(first):
        use_mknod = True
        try:
            for i in range(first, n, nthreads):
                p = f"{d}/e{i:07d}"
                if use_mknod:
                    try:
                        os.mknod(p, 0o100644)
                        continue
                    except OSError as e:
                        if e.errno not in (errno.EPERM, errno.ENOSYS, errno.EOPNOTSUPP):
                            raise
                        use_mknod = False
                os.close(os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        except OSError as e:
            errors.append(e)

    ts = [threading.Thread(target=make, args=(k,)) for k in range(nthreads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        raise errors[0]
    print(n)


def writers(d, prefix, nfiles, concurrency, size=MIB):
    """nfiles writers, each a process forked from this one that writes one
    file, at most `concurrency` of them at a time: 1,000 at once, or 10 at
    a time 100 times over, cost the same per writer in this script, so
    only the concurrency differs. (Threads of one python process take
    turns at its interpreter lock: 1,000 woken at once wrote 1 MiB files
    to tmpfs at a quarter of the speed of 1,000 C threads; and a process
    that wrote many files would pay less per file than one that wrote
    one.) A child waits for SIGUSR1 (sent to it alone, so that releasing
    one wakes no other), reports on a pipe after its close (the clock
    stops at the last report) and exits only after that, so that no exit
    lands in the timed window."""
    buf = os.urandom(size)
    done_r, done_w = os.pipe()
    exit_r, exit_w = os.pipe()
    paths = [f"{d}/{prefix}-{i:05d}" for i in range(nfiles)]
    flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY
    go = {signal.SIGUSR1}
    signal.pthread_sigmask(signal.SIG_BLOCK, go)  # children inherit it
    pids = []

    def write_file(path, fl):
        fd = os.open(path, fl, 0o644)
        try:
            view = memoryview(buf)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)

    def child(path):
        os.close(done_r)
        os.close(exit_w)
        # A rehearsal on /dev/null before the release: the pages this code
        # path touches are copied from the parent's now, not in the timed
        # window (on tmpfs that made 1,000 writers twice as fast, within
        # 10-25% of 1,000 C threads).
        write_file("/dev/null", os.O_WRONLY)
        signal.sigwait(go)
        status = b"0"
        try:
            write_file(path, flags)
        except OSError as e:
            os.write(2, f"writer {path}: {e}\n".encode())
            status = b"1"
        os.write(done_w, status)
        os.read(exit_r, 1)  # b"" once the parent closes exit_w
        os._exit(0)

    gc.disable()  # no collection touches (and so copies) the parent's pages
    gc.freeze()
    try:
        for p in paths:
            pid = os.fork()
            if pid == 0:
                try:
                    child(p)
                finally:
                    os._exit(1)
            pids.append(pid)
    except OSError as e:
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        for pid in pids:
            os.waitpid(pid, 0)
        sys.exit(f"cannot start {nfiles} writers: {e}")
    os.close(done_w)
    os.close(exit_r)
    t0 = time.perf_counter()
    started = min(concurrency, nfiles)
    for pid in pids[:started]:
        os.kill(pid, signal.SIGUSR1)
    reports = b""
    while len(reports) < nfiles:
        r = os.read(done_r, nfiles)
        if not r:
            break
        reports += r
        while started < min(nfiles, len(reports) + concurrency):
            os.kill(pids[started], signal.SIGUSR1)
            started += 1
    dt = time.perf_counter() - t0
    os.close(exit_w)
    for pid in pids:
        os.waitpid(pid, 0)
    failed = nfiles - reports.count(b"0")
    if failed:
        sys.exit(f"{failed} of {nfiles} writers failed")
    # Untimed: every file holds its bytes.
    for p in paths:
        if os.stat(p).st_size != size:
            sys.exit(f"{p}: {os.stat(p).st_size} bytes, not {size}")
    print(round(nfiles * size / dt / 1e6, 1))


def main(argv):
    try:
        if argv[1:2] == ["archive"] and len(argv) == 5:
            archive(argv[2], int(argv[3]), int(argv[4]))
        elif argv[1:2] == ["entries"] and len(argv) == 4:
            entries(argv[2], int(argv[3]))
        elif argv[1:2] == ["writers"] and len(argv) == 6:  # DIR PREFIX FILES CONCURRENCY
            writers(argv[2], argv[3], int(argv[4]), int(argv[5]))
        else:
            sys.exit(__doc__)
    except OSError as e:
        sys.exit(f"many_files.py {argv[1]}: {e}")


if __name__ == "__main__":
    main(sys.argv)
