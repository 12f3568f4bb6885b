#!/usr/bin/env bash
# append_close.sh — what an append to a closed file costs: the logger's
# pattern (open(O_APPEND), one line, close(), again) and a shell script's
# (`exec >>log`, each command a child that writes and exits, so each
# child's exit is a close of the file), on the native disk, bindfs, and
# leasefs at R=1 and R=3 with two builds (BEFORE and AFTER), interleaved in
# ONE run. On leasefs every close finalises the file's last block and the
# next write reopens it for append under a new generation stamp, durably
# (docs/SEMANTICS.md, "Durability", "Order on disk"), so this is the price
# of that protocol against a filesystem that has none.
#
#   benches/probes/append_close.sh BEFORE_BIN AFTER_BIN [ROUNDS] [N]
#
# Per round and target: N open+append+close cycles timed in python, then
# N/2 `/bin/echo` children of one `sh` appending to one file, and the same
# loop with `/bin/true` (no write: what fork and exec cost by themselves,
# subtracted). Prints medians over the rounds: µs per cycle and per
# child, and ratios to bindfs and to BEFORE. Defaults: 3 rounds, N = 500.
# Scratch under BENCH_DIR (default /var/tmp). Needs root, bindfs,
# fusermount3, python3.
set -uo pipefail

before=${1:?BEFORE_BIN}
after=${2:?AFTER_BIN}
rounds=${3:-3}
n=${4:-500}
work=$(mktemp -d "${BENCH_DIR:-/var/tmp}/append-close.XXXXXX")
mounts=()
cleanup() {
    for m in "${mounts[@]}"; do
        fusermount3 -u "$m" 2>/dev/null || umount -l "$m" 2>/dev/null
    done
    rm -rf "$work"
}
trap cleanup EXIT

# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"

mkdir -p "$work/native" "$work/bindfs-src" "$work/bindfs"
bindfs -o big_writes "$work/bindfs-src" "$work/bindfs" 2>/dev/null ||
    bindfs "$work/bindfs-src" "$work/bindfs" || exit 1
mounts+=("$work/bindfs")
declare -A dir=([native]=$work/native [bindfs]=$work/bindfs)
for t in before-r1:$before:1 before-r3:$before:3 after-r1:$after:1 after-r3:$after:3; do
    IFS=: read -r name bin r <<<"$t"
    mount_leasefs "$name" "$bin" "$r"
    dir[$name]=$work/$name/mnt
done

targets=(native bindfs before-r1 after-r1 before-r3 after-r3)
children=$((n / 2))
for ((k = 1; k <= rounds; k++)); do
    for t in "${targets[@]}"; do
        d=${dir[$t]}
        python3 - "$d/cycles.$k" "$n" >"$work/$t.$k.cycle" <<'EOF' || exit 1
import os, sys, time
p, n = sys.argv[1], int(sys.argv[2])
t = time.perf_counter()
for i in range(n):
    fd = os.open(p, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, b"line %d\n" % i)
    os.close(fd)
print((time.perf_counter() - t) / n * 1e6)
EOF
        for what in echo true; do
            s=$(date +%s%N)
            sh -c "for i in \$(seq $children); do /bin/$what line \$i; done" >"$d/children.$what.$k"
            e=$(date +%s%N)
            echo "$(((e - s) / 1000 / children))" >"$work/$t.$k.$what"
        done
        lines=$(wc -l <"$d/cycles.$k")
        [ "$lines" = "$n" ] || { echo "$t: $lines lines of $n" >&2; exit 1; }
    done
done

python3 - "$work" "$rounds" "${targets[@]}" <<'EOF'
import statistics, sys
work, rounds, targets = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def val(t, k, what):
    return float(open(f"{work}/{t}.{k}.{what}").read())
res = {}
for t in targets:
    cyc = statistics.median(val(t, k, "cycle") for k in range(1, rounds + 1))
    child = statistics.median(val(t, k, "echo") - val(t, k, "true") for k in range(1, rounds + 1))
    res[t] = (cyc, child)
print(f"{'target':<10} {'cycle us':>9} {'child us':>9} {'cycle/bf':>9} {'child/bf':>9} {'cycle/before':>13} {'child/before':>13}")
for t in targets:
    c, ch = res[t]
    bf = res["bindfs"]
    before = t.replace("after", "before")
    vs = (f"{c / res[before][0]:>13.2f} {ch / res[before][1]:>13.2f}" if t.startswith("after") else "")
    print(f"{t:<10} {c:>9.0f} {ch:>9.0f} {c / bf[0]:>9.2f} {ch / max(bf[1], 1):>9.2f} {vs}")
EOF
