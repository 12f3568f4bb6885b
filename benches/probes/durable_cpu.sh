#!/usr/bin/env bash
# durable_cpu.sh — durable small files by one writer and by four, with the
# daemon's CPU time per file: each build given is mounted at R=REPL on a
# fresh directory, side by side, and the builds run in alternation round
# after round, so the machine's load hits each alike. The CPU time per
# file (utime + stime of the daemon, /proc/PID/stat) varies far less from
# run to run here than files/s do, and on two vCPUs it is what bounds the
# four-writer row (benches/PROFILE.md, "tenth look").
#
#   benches/probes/durable_cpu.sh ROUNDS REPL BIN [BIN...]
#
# One writer creates 2,000 files (create + 4 KiB write + fsync + close),
# four writers 500 each. Prints per round and build files/s and µs of
# daemon CPU per file, then the medians. Scratch under BENCH_DIR (default
# /var/tmp), removed at the end. Nothing is removed before or between
# rounds: on ext4 without a journal (/var/tmp here) creates slow down for
# minutes after many removals (recently_deleted()), so do not start it
# right after removing many files either. Needs root, fusermount3.
set -uo pipefail

rounds=${1:?ROUNDS}
repl=${2:?REPL}
shift 2
[[ $# -gt 0 ]] || { echo "usage: $0 ROUNDS REPL BIN [BIN...]" >&2; exit 2; }
work=$(mktemp -d "${BENCH_DIR:-/var/tmp}/durable-cpu.XXXXXX")
names=()
cleanup() {
    for t in "${names[@]}"; do
        mountpoint -q "$work/$t/mnt" && umount "$work/$t/mnt"
    done
    sleep 1
    rm -rf "$work"
}
trap cleanup EXIT

i=0
for bin in "$@"; do
    i=$((i + 1))
    d=$work/b$i
    mkdir -p "$d"/{mnt,data,dn1,dn2,dn3}
    dns=(--datanode "$d/dn1")
    [[ $repl == 1 ]] || dns+=(--datanode "$d/dn2" --datanode "$d/dn3" --replication "$repl")
    "$bin" mount "$d/mnt" --data "$d/data" "${dns[@]}" >/dev/null 2>&1 ||
        { echo "cannot mount $bin at $d/mnt" >&2; exit 1; }
    names+=("b$i")
done
echo "builds: $(for k in $(seq $#); do echo -n "b$k=${!k} "; done)"

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
writers() { # DIR FILES WRITERS TAG -> files/s
    python3 - "$@" <<'PY'
import os, sys, time
from multiprocessing import Process
d, n, w, tag = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
def run(k):
    for i in range(n):
        fd = os.open(f"{d}/{tag}-{k}-{i}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        os.write(fd, b"x" * 4096)
        os.fsync(fd)
        os.close(fd)
t = time.time()
ps = [Process(target=run, args=(k,)) for k in range(w)]
[p.start() for p in ps]
[p.join() for p in ps]
print(round(n * w / (time.time() - t)))
PY
}

hz=$(getconf CLK_TCK)
out=$work/rounds.txt
for r in $(seq "$rounds"); do
    for t in "${names[@]}"; do
        pid=$(pgrep -f -- "mount $work/$t/mnt " | head -1)
        c0=$(cpu_ticks "$pid")
        one=$(writers "$work/$t/mnt" 2000 1 "r$r-one")
        c1=$(cpu_ticks "$pid")
        four=$(writers "$work/$t/mnt" 500 4 "r$r-four")
        c2=$(cpu_ticks "$pid")
        us1=$(((c1 - c0) * 1000000 / hz / 2000))
        us4=$(((c2 - c1) * 1000000 / hz / 2000))
        echo "round $r $t: one writer $one files/s, $us1 µs CPU/file; four writers $four files/s, $us4 µs CPU/file"
        echo "$t $one $four $us1 $us4" >>"$out"
    done
done
python3 - "$out" <<'PY'
import statistics as st, sys, collections
d = collections.defaultdict(lambda: [[], [], [], []])
for line in open(sys.argv[1]):
    f = line.split()
    for k in range(4):
        d[f[0]][k].append(int(f[k + 1]))
for t, v in d.items():
    m = [st.median(x) for x in v]
    print(f"median {t}: one writer {m[0]:.0f} files/s, {m[2]:.0f} µs CPU/file; "
          f"four writers {m[1]:.0f} files/s ({m[1] / m[0]:.2f}x one), {m[3]:.0f} µs CPU/file")
PY
