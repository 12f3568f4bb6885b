#!/usr/bin/env bash
# cold_reads.sh BIN R ROUNDS [MOUNT_OPTIONS] — the cold read of
# benches/PROFILE.md "Cold reads: the bytes cached once": a 1 GiB file
# written by fio on leasefs with R datanodes (in BENCH_DIR, default
# /var/tmp), then per round: unmount, `sync; echo 3 > drop_caches`, mount,
# fio 1 MiB reads ("cold"), then the same read with the file's own pages
# dropped (`--invalidate=1`: "served", the replicas wherever the cold read
# left them), and each datanode's (reads_in_memory, readers_reused,
# reads_direct). Root only. Run two builds alternately to compare, e.g.
#   for i in 1 2; do cold_reads.sh old/leasefs 1 2; cold_reads.sh target/release/leasefs 1 2; done
#   cold_reads.sh target/release/leasefs 1 2 "-o replica_reads=cached"
set -u
bin=${1:?leasefs binary}; r=${2:?replication}; rounds=${3:?rounds}; opts=${4:-}
w=$(mktemp -d "${BENCH_DIR:-/var/tmp}/cold-reads.XXXXXX")
args=(mount "$w/mnt" --data "$w/data" --replication "$r")
# shellcheck disable=SC2206
[[ -n $opts ]] && args+=($opts)
mkdir -p "$w/mnt" "$w/data"
for i in $(seq "$r"); do mkdir -p "$w/dn$i"; args+=(--datanode "$w/dn$i"); done
pid=
up() {
    "$bin" "${args[@]}" >>"$w/log" 2>&1 || { echo "mount failed: $(tail -1 "$w/log")" >&2; exit 1; }
    pid=$(sed -n 's/^pid //p' "$w/data/lock")
}
down() {
    fusermount3 -u "$w/mnt" 2>/dev/null
    # The daemon exits once unmounted; wait for it (by its pid).
    while [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
}
trap 'down; rm -rf "$w"' EXIT
mbs() { python3 -c 'import json,sys; print(round(json.load(sys.stdin)["jobs"][0]["read"]["bw_bytes"]/1e6))'; }
up
fio --name=w --filename="$w/mnt/f" --rw=write --bs=1M --size=1024M --end_fsync=1 \
    --ioengine=psync --fallocate=none >/dev/null
for round in $(seq "$rounds"); do
    down
    sync
    echo 3 >/proc/sys/vm/drop_caches
    up
    cold=$(fio --name=r --filename="$w/mnt/f" --rw=read --bs=1M --size=1024M \
        --ioengine=psync --output-format=json | mbs)
    served=$(fio --name=r --filename="$w/mnt/f" --rw=read --bs=1M --size=1024M \
        --ioengine=psync --invalidate=1 --output-format=json | mbs)
    counters=$("$bin" stats "$w/mnt" --json --once | python3 -c '
import json, sys
print([(d["reads_in_memory"], d["readers_reused"], d.get("reads_direct")) for d in json.load(sys.stdin)["datanodes"]])')
    echo "R=$r round $round: cold $cold MB/s, served $served MB/s; per datanode (in memory, reused, direct) $counters"
done
