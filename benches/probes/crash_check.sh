#!/usr/bin/env bash
# crash_check.sh — what a mount after a crash has to check (docs/SEMANTICS.md,
# "Durability", *What a crash may have torn*): each build given is mounted
# at R=3 on a fresh directory with `-o housekeeping_interval=INTERVAL`,
# FILES files of KIB KiB (default 4; no fsync) are written, the daemon runs WAIT
# seconds more, then it is killed (-9) and mounted again. Prints, per build:
# files/s of the writes, the replicas the new mount gave housekeeping to
# check (`unflushed_checked`), how long the mount took, and how long until
# housekeeping had checked them (the flush marks moved, `DN/FLUSHED`).
#
#   [KIB=4] benches/probes/crash_check.sh FILES WAIT INTERVAL BIN [BIN...]
#
# Scratch under BENCH_DIR (default /var/tmp), removed at the end. Needs
# root, fusermount3, python3.
set -uo pipefail

files=${1:?FILES}
wait_s=${2:?WAIT}
interval=${3:?INTERVAL}
shift 3
[[ $# -gt 0 ]] || { echo "usage: $0 FILES WAIT INTERVAL BIN [BIN...]" >&2; exit 2; }
work=$(mktemp -d "${BENCH_DIR:-/var/tmp}/crash-check.XXXXXX")
mounted=()
cleanup() {
    for m in "${mounted[@]}"; do
        mountpoint -q "$m" && { umount "$m" || umount -l "$m"; }
    done
    sleep 1
    rm -rf "$work"
}
trap cleanup EXIT

now() { date +%s.%N; }
marks() { cat "$1"/dn{1,2,3}/FLUSHED 2>/dev/null | tr '\n' ' '; }

i=0
for bin in "$@"; do
    i=$((i + 1))
    d=$work/b$i
    mkdir -p "$d"/{mnt,data,dn1,dn2,dn3}
    args=("$d/mnt" --data "$d/data" --datanode "$d/dn1" --datanode "$d/dn2"
        --datanode "$d/dn3" --replication 3 -o "housekeeping_interval=$interval")
    "$bin" mount "${args[@]}" >/dev/null 2>&1 || { echo "cannot mount $bin" >&2; exit 1; }
    mounted+=("$d/mnt")
    rate=$(python3 - "$d/mnt" "$files" "${KIB:-4}" <<'PY'
import os, sys, time
d, n, kib = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
data = os.urandom(kib << 10)
t = time.time()
for i in range(n):
    with open(f"{d}/f{i}", "wb") as f:
        f.write(data)
print(round(n / (time.time() - t)))
PY
)
    sleep "$wait_s"
    pid=$(pgrep -f -- "mount $d/mnt " | head -1)
    kill -9 "$pid"
    while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
    umount -l "$d/mnt" 2>/dev/null || fusermount3 -uz "$d/mnt"
    before=$(marks "$d")
    t0=$(now)
    "$bin" mount "${args[@]}" >/dev/null 2>&1 || { echo "cannot remount $bin" >&2; exit 1; }
    t1=$(now)
    checked=$("$bin" stats --once --json "$d/mnt" |
        python3 -c 'import json,sys; print(sum(d.get("unflushed_checked",0) for d in json.load(sys.stdin)["datanodes"]))')
    # Checked once the marks moved past where the crash left them.
    while [[ "$(marks "$d")" == "$before" ]] && (($(echo "$(now) - $t1 < 600" | bc))); do
        sleep 0.2
    done
    t2=$(now)
    printf '%s: %s files/s; after the crash %s replicas to check, mount %.2f s, checked %.1f s after it\n' \
        "$bin" "$rate" "$checked" "$(echo "$t1 - $t0" | bc)" "$(echo "$t2 - $t1" | bc)"
    umount "$d/mnt"
done
