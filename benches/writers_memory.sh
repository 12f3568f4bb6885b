#!/usr/bin/env bash
# benches/writers_memory.sh — daemon memory with N concurrent writers.
#
#   benches/writers_memory.sh [N_WRITERS] [SECONDS]     (defaults 100, 5)
#
# Mounts leasefs (R=3, -o max_packets_in_flight=80,packet_size=64K), starts N
# python3 writers that each append 1 MiB writes to their own file for SECONDS,
# samples the daemon's VmRSS every 100 ms, and prints the idle base, the peak,
# and the bound the design promises: base + N x (max_packets_in_flight + 1) x
# packet_size + N x 1 MiB (one blocked request per stream). Report only.
# The last line, `result writers=N base_kib=B peak_kib=P bound_kib=X`, is
# what benches/run.sh reads. BENCH_DIR: parent of the scratch directory
# (default /var/tmp).
set -euo pipefail
n=${1:-100}
secs=${2:-5}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin=${LEASEFS_BIN:-$root/target/release/leasefs}
dir=$(mktemp -d "${BENCH_DIR:-/var/tmp}/leasefs-mem.XXXXXX")
mnt=$dir/mnt
mkdir -p "$mnt"
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    fusermount3 -u "$mnt" 2>/dev/null || fusermount3 -uz "$mnt" 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT
"$bin" mount "$mnt" --data "$dir/data" -o max_packets_in_flight=80,packet_size=64K
daemon=$(awk '{print $2}' "$dir/data/lock")
rss() { awk '/^VmRSS:/ {print $2}' "/proc/$daemon/status"; }
sleep 0.5
base=$(rss)
for i in $(seq "$n"); do
    python3 -c "
import os, sys, time
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
buf = os.urandom(1 << 20)
end = time.time() + float(sys.argv[2])
while time.time() < end:
    os.write(fd, buf)
os.close(fd)
" "$mnt/w$i" "$secs" &
    pids+=($!)
done
peak=$base
deadline=$((SECONDS + secs + 30))
while [[ $SECONDS -lt $deadline ]]; do
    r=$(rss)
    ((r > peak)) && peak=$r
    alive=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1 && break; done
    ((alive)) || break
    sleep 0.1
done
wait
bound=$((base + n * (81 * 64 + 1024)))
printf 'writers %d, %d s each\n' "$n" "$secs"
printf 'daemon RSS idle base   %8d KiB\n' "$base"
printf 'daemon RSS peak        %8d KiB\n' "$peak"
printf 'bound (base + N x (81 x 64 KiB + 1 MiB)) %8d KiB\n' "$bound"
printf 'peak per writer above base %d KiB\n' $(((peak - base) / n))
printf 'result writers=%d base_kib=%d peak_kib=%d bound_kib=%d\n' "$n" "$base" "$peak" "$bound"
