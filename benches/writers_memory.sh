#!/usr/bin/env bash
# benches/writers_memory.sh — daemon memory with N concurrent writers.
#
#   benches/writers_memory.sh [N_WRITERS] [MIB_EACH] [WRITE_BUFFER]   (defaults 100, 8, 256M)
#
# Mounts leasefs (DATANODES datanodes, default 3, as many replicas; -o
# max_packets_in_flight=80,packet_size=64K,write_buffer=WRITE_BUFFER),
# starts N writer threads (one python3 process) that each append MIB_EACH
# MiB in 1 MiB writes to their own file (a fixed amount: the disk takes
# N x MIB_EACH x DATANODES MiB, whatever its speed), samples the
# daemon's VmRSS every 100 ms, and prints the idle base, the peak, and the
# bound the design promises (docs/SEMANTICS.md "Writing"): base +
# write_buffer + N x (2 packets + 1 MiB): per stream one packet being
# filled, one in flight outside the buffer, and one blocked request. Also
# prints the write buffer's own peak and how often writers waited for it
# (the mount root's user.leasefs.write_buffer). Report only. LEASEFS_O:
# more -o options (e.g. write_buffer=4M). To make acks lag so that the
# buffer fills, put the datanodes on a tools/powercut disk slowed with
# `powercut slow`, as tests/write_buffer.rs does.
# The last line, `result writers=N base_kib=B peak_kib=P bound_kib=X`, is
# what benches/run.sh reads. BENCH_DIR: parent of the scratch directory
# (default /var/tmp).
set -euo pipefail
n=${1:-100}
mib=${2:-8}
wbuf=${3:-256M}
ndn=${DATANODES:-3}
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
dn_args=()
for i in $(seq "$ndn"); do dn_args+=(--datanode "$dir/dn$i"); done
o="max_packets_in_flight=80,packet_size=64K"
# WRITE_BUFFER "-": no write_buffer option (a build from before it existed).
[[ $wbuf == - ]] || o+=",write_buffer=$wbuf"
[[ -z ${LEASEFS_O:-} ]] || o+=",$LEASEFS_O"
"$bin" mount "$mnt" --data "$dir/data" "${dn_args[@]}" -o "$o"
daemon=$(awk '{print $2}' "$dir/data/lock")
rss() { awk '/^VmRSS:/ {print $2}' "/proc/$daemon/status"; }
sleep 0.5
base=$(rss)
python3 -c "
import os, sys, threading, time
n, mib, mnt = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
buf = os.urandom(1 << 20)
def run(i):
    fd = os.open('%s/w%d' % (mnt, i), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for _ in range(mib):
        os.write(fd, buf)
    os.close(fd)
ts = [threading.Thread(target=run, args=(i,)) for i in range(n)]
for t in ts: t.start()
for t in ts: t.join()
" "$n" "$mib" "$mnt" &
pids+=($!)
peak=$base
deadline=$((SECONDS + 600))
while [[ $SECONDS -lt $deadline ]]; do
    r=$(rss)
    ((r > peak)) && peak=$r
    kill -0 "${pids[0]}" 2>/dev/null || break
    sleep 0.1
done
wait
wb=$(getfattr --only-values -n user.leasefs.write_buffer "$mnt" 2>/dev/null || echo '{}')
wbuf_kib=$(python3 -c "import json,sys; print(json.loads(sys.argv[1]).get('bytes', 0) // 1024)" "$wb")
bound=$((base + wbuf_kib + n * (2 * 64 + 1024)))
printf 'writers %d, %d MiB each, %d datanodes, write_buffer %s\n' "$n" "$mib" "$ndn" "$wbuf"
printf 'daemon RSS idle base   %8d KiB\n' "$base"
printf 'daemon RSS peak        %8d KiB\n' "$peak"
printf 'bound (base + write_buffer + N x (2 x 64 KiB + 1 MiB)) %8d KiB\n' "$bound"
printf 'peak per writer above base %d KiB\n' $(((peak - base) / n))
printf 'write buffer: %s\n' "$wb"
printf 'result writers=%d base_kib=%d peak_kib=%d bound_kib=%d\n' "$n" "$base" "$peak" "$bound"
