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
    many_files.py writers DIR PREFIX WRITERS FILES_EACH
        WRITERS threads of this process, released together, each make
        FILES_EACH files of 1 MiB one after another (create, one 1 MiB
        write, close); prints the aggregate MB/s (10^6 bytes) from the
        release to the last close, after checking (untimed) that every
        file holds 1 MiB.

Any failure exits non-zero with a message on stderr (run.sh then records NA).
"""

import errno
import io
import os
import random
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


def writers(d, prefix, nwriters, each):
    buf = os.urandom(MIB)
    threading.stack_size(256 * 1024)
    start = threading.Barrier(nwriters + 1)
    errors = []

    def run(i):
        try:
            start.wait()
            for k in range(each):
                fd = os.open(f"{d}/{prefix}-{i:04d}-{k:04d}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
                try:
                    view = memoryview(buf)
                    while view:
                        view = view[os.write(fd, view):]
                finally:
                    os.close(fd)
        except Exception as e:  # reported below, after every thread ended
            errors.append(f"writer {i}: {e}")
            start.abort()

    ts = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(nwriters)]
    try:
        for t in ts:
            t.start()
    except RuntimeError as e:  # cannot start a thread: release the others
        start.abort()
        sys.exit(f"cannot start {nwriters} writer threads: {e}")
    try:
        start.wait()
    except threading.BrokenBarrierError:
        pass
    t0 = time.perf_counter()
    for t in ts:
        t.join()
    dt = time.perf_counter() - t0
    if errors:
        sys.exit(f"{len(errors)} writer(s) failed; first: {errors[0]}")
    # Untimed: every file holds its MiB.
    for i in range(nwriters):
        for k in range(each):
            p = f"{d}/{prefix}-{i:04d}-{k:04d}"
            if os.stat(p).st_size != MIB:
                sys.exit(f"{p}: {os.stat(p).st_size} bytes, not {MIB}")
    print(round(nwriters * each * MIB / dt / 1e6, 1))


def main(argv):
    try:
        if argv[1:2] == ["archive"] and len(argv) == 5:
            archive(argv[2], int(argv[3]), int(argv[4]))
        elif argv[1:2] == ["entries"] and len(argv) == 4:
            entries(argv[2], int(argv[3]))
        elif argv[1:2] == ["writers"] and len(argv) == 6:
            writers(argv[2], argv[3], int(argv[4]), int(argv[5]))
        else:
            sys.exit(__doc__)
    except OSError as e:
        sys.exit(f"many_files.py {argv[1]}: {e}")


if __name__ == "__main__":
    main(sys.argv)
