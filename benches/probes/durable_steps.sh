#!/usr/bin/env bash
# durable_steps.sh — where a durable small file's time goes, step by step:
# create + 4 KiB write + fsync + close, each step timed in python over N
# new files, on bindfs (-o big_writes) and on leasefs at R=1 and R=3 for
# each build given, all mounted side by side and run in alternation round
# after round, so that the machine's load hits every target alike.
# Prints, per round and target, files/s and µs per step.
#
#   benches/probes/durable_steps.sh ROUNDS FILES BIN [BIN...]
#
# Scratch under BENCH_DIR (default /var/tmp, a real disk), removed at the
# end. Needs root, bindfs, fusermount3.
set -uo pipefail

rounds=${1:?ROUNDS}
n=${2:?FILES}
shift 2
[[ $# -gt 0 ]] || { echo "usage: $0 ROUNDS FILES BIN [BIN...]" >&2; exit 2; }
work=$(mktemp -d "${BENCH_DIR:-/var/tmp}/durable-steps.XXXXXX")
names=()
cleanup() {
    for t in bind "${names[@]}"; do
        mountpoint -q "$work/$t/mnt" && umount "$work/$t/mnt"
    done
    sleep 1
    rm -rf "$work"
}
trap cleanup EXIT

mount_leasefs() { # NAME BIN REPLICATION
    local d=$work/$1 dns
    mkdir -p "$d"/{mnt,data,dn1,dn2,dn3}
    if [[ $3 == 1 ]]; then
        dns=(--datanode "$d/dn1")
    else
        dns=(--datanode "$d/dn1" --datanode "$d/dn2" --datanode "$d/dn3" --replication 3)
    fi
    "$2" mount "$d/mnt" --data "$d/data" "${dns[@]}" >/dev/null 2>&1 ||
        { echo "cannot mount $2 at $d/mnt" >&2; exit 1; }
    names+=("$1")
}

mkdir -p "$work/bind/src" "$work/bind/mnt"
bindfs -o big_writes "$work/bind/src" "$work/bind/mnt" || exit 1
i=0
for bin in "$@"; do
    i=$((i + 1))
    mount_leasefs "b$i-r1" "$bin" 1
    mount_leasefs "b$i-r3" "$bin" 3
done
echo "builds: $(for k in $(seq $#); do echo -n "b$k=${!k} "; done)"
for r in $(seq "$rounds"); do
    for t in bind "${names[@]}"; do
        echo -n "round $r $t: "
        python3 - "$work/$t/mnt" "$n" "r$r" <<'PY'
import os, sys, time
d, n, tag = sys.argv[1], int(sys.argv[2]), sys.argv[3]
ts = [0.0] * 4
t0 = time.time()
for i in range(n):
    a = time.perf_counter()
    fd = os.open(f"{d}/{tag}-{i}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    b = time.perf_counter()
    os.write(fd, b"x" * 4096)
    c = time.perf_counter()
    os.fsync(fd)
    e = time.perf_counter()
    os.close(fd)
    f = time.perf_counter()
    for k, v in enumerate((b - a, c - b, e - c, f - e)):
        ts[k] += v
us = [round(t / n * 1e6) for t in ts]
print(f"{n / (time.time() - t0):.0f} files/s; µs per file: create {us[0]} write {us[1]} fsync {us[2]} close {us[3]}")
PY
    done
done
