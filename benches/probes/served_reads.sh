#!/usr/bin/env bash
# served_reads.sh BIN|fc ROUNDS [MOUNT_OPTIONS] — reads the daemon serves
# with the replicas in memory (benches/PROFILE.md): a 1 GiB file written
# by fio (leasefs R=1, or fuse-ceiling's `file` mode with `fc`), then per
# round `fio --invalidate=1` (the file's own pages dropped at open, the
# replicas, just written, in the page cache), with the daemon's CPU time
# and each CPU's busy share over the read (/proc). BENCH_DIR as in run.sh.
#   for i in 1 2; do served_reads.sh fc 4; served_reads.sh target/release/leasefs 4; done
set -u
bin=${1:?leasefs binary or fc}; rounds=${2:?rounds}; opts=${3:-}
w=$(mktemp -d "${BENCH_DIR:-/var/tmp}/served-reads.XXXXXX")
mkdir -p "$w/mnt" "$w/data" "$w/dn"
if [[ $bin == fc ]]; then
    here=$(cd "$(dirname "$0")/../.." && pwd)
    fc=$("${FUSE_CEILING_DIR:-$here/../shared/tools/fuse-ceiling}/build.sh" | tail -1)
    "$fc" file "$w/mnt" --threads 2 --backing "$w/dn" >/dev/null 2>&1 &
else
    # shellcheck disable=SC2086
    "$bin" mount "$w/mnt" --data "$w/data" --datanode "$w/dn" -f $opts >"$w/log" 2>&1 &
fi
pid=$!
trap 'fusermount3 -u "$w/mnt" 2>/dev/null; wait "$pid" 2>/dev/null; rm -rf "$w"' EXIT
for _ in $(seq 100); do mountpoint -q "$w/mnt" && break; sleep 0.1; done
mountpoint -q "$w/mnt" || { echo "did not mount" >&2; exit 1; }
fio --name=w --filename="$w/mnt/f" --rw=write --bs=1M --size=1024M --end_fsync=1 \
    --ioengine=psync --fallocate=none >/dev/null
cpus() { awk '/^cpu[0-9]/ { print $1, $2 + $3 + $4 + $7 + $8, $5 + $6 }' /proc/stat; }
ticks() { awk '{ print $14 + $15 }' "/proc/$pid/stat"; }
for round in $(seq "$rounds"); do
    a=$(cpus); t0=$(ticks)
    bw=$(fio --name=r --filename="$w/mnt/f" --rw=read --bs=1M --size=1024M --invalidate=1 \
        --ioengine=psync --output-format=json |
        python3 -c 'import json,sys; print(round(json.load(sys.stdin)["jobs"][0]["read"]["bw_bytes"]/1e6))')
    b=$(cpus); t1=$(ticks)
    busy=$(paste <(echo "$a") <(echo "$b") |
        awk '{ printf "%s %d%%  ", $1, 100 * ($5 - $2) / (($5 - $2) + ($6 - $3)) }')
    echo "$bin round $round: $bw MB/s, daemon CPU $((t1 - t0)) ticks, $busy"
done
