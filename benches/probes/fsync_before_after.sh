#!/usr/bin/env bash
# fsync_before_after.sh — what leasefs's durability rules cost an fsync:
# 4 KiB appends each followed by fsync (fio --fsync=1), on tmpfs, on the
# native disk, and on leasefs at R=1 and R=3 with two builds (BEFORE, e.g.
# one of main before a change, and AFTER), interleaved in ONE run so that
# the machine's load hits every target alike. Prints, per target, the
# median over the rounds of fio's fsync p50 and p99 (µs) and the ratio of
# each leasefs p50 to the native one and to BEFORE's.
#
#   benches/probes/fsync_before_after.sh BEFORE_BIN AFTER_BIN [ROUNDS] [FSYNCS]
#
# Defaults: 3 rounds of 500 fsyncs. Scratch under BENCH_DIR (default
# /var/tmp, a real disk). Needs root, fio, fusermount3.
set -uo pipefail

before=${1:?BEFORE_BIN}
after=${2:?AFTER_BIN}
rounds=${3:-3}
n=${4:-500}
work=$(mktemp -d "${BENCH_DIR:-/var/tmp}/fsync-ba.XXXXXX")
mounts=()
cleanup() {
    for m in "${mounts[@]}"; do
        fusermount3 -u "$m" 2>/dev/null || umount -l "$m" 2>/dev/null
    done
    umount "$work/tmpfs" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT

mkdir -p "$work/tmpfs" "$work/native"
mount -t tmpfs -o size=256m tmpfs "$work/tmpfs" || exit 1

# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"

declare -A dir=([tmpfs]=$work/tmpfs [native]=$work/native)
for t in before-r1:$before:1 before-r3:$before:3 after-r1:$after:1 after-r3:$after:3; do
    IFS=: read -r name bin r <<<"$t"
    mount_leasefs "$name" "$bin" "$r"
    dir[$name]=$work/$name/mnt
done

targets=(tmpfs native before-r1 after-r1 before-r3 after-r3)
for ((k = 1; k <= rounds; k++)); do
    for t in "${targets[@]}"; do
        f=${dir[$t]}/fsync.dat
        fio --name=fsync --filename="$f" --rw=write --bs=4k --size="$((n * 4))k" \
            --fsync=1 --ioengine=psync --fallocate=none --output-format=json \
            >"$work/$t.$k.json" 2>"$work/$t.$k.err" || {
            echo "fio failed on $t: $(head -c 300 "$work/$t.$k.err")" >&2
            exit 1
        }
        rm -f "$f"
    done
done

python3 - "$work" "$rounds" "${targets[@]}" <<'EOF'
import json, statistics, sys
work, rounds, targets = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def pct(t, k, p):
    j = json.load(open(f"{work}/{t}.{k}.json"))
    return j["jobs"][0]["sync"]["lat_ns"]["percentile"][p] / 1000
res = {}
for t in targets:
    res[t] = tuple(statistics.median(pct(t, k, p) for k in range(1, rounds + 1))
                   for p in ("50.000000", "99.000000"))
print(f"{'target':<10} {'p50 us':>8} {'p99 us':>8} {'p50/native':>11} {'p50/before':>11}")
for t in targets:
    p50, p99 = res[t]
    vs_nat = p50 / res["native"][0]
    before = t.replace("after", "before")
    vs_before = f"{p50 / res[before][0]:.2f}" if t.startswith("after") else ""
    print(f"{t:<10} {p50:>8.1f} {p99:>8.0f} {vs_nat:>11.2f} {vs_before:>11}")
EOF
