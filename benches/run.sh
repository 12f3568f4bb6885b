#!/usr/bin/env bash
# benches/run.sh — leasefs against the native directory and the FUSE ceiling,
# measured in ONE run on the same disk (see benches/README.md).
#
#   benches/run.sh                # full: 1 GiB, 10,000 files, 2000 fsyncs, 3 runs
#   benches/run.sh --quick        # CI: 64 MiB, 1000 files, 200 fsyncs, 1 run
#                                 # (many-file rows: full 10,000-file tree, 100,000
#                                 # entries, 1,000 writers; quick 1,000, 10,000, 250)
#   benches/run.sh --runs 5 --targets native,leasefs-r1
#   benches/run.sh --no-extra     # without the lease-manager and memory rows
#   benches/run.sh --rows tree,ls,writers --no-extra   # only some mount figures
#   LEASEFS_BEFORE_BIN=old/leasefs benches/run.sh --targets native,leasefs-r1,leasefs-r3,before-r1,before-r3
#                                 # a change's cost: an older build beside this one, in one run
#
# Targets: native, fuse-ceiling (../shared/tools/fuse-ceiling, `file` mode),
# bindfs (-o big_writes), leasefs-r1 (one datanode), leasefs-r3 (three datanodes),
# before-r1 and before-r3 (the same with the build LEASEFS_BEFORE_BIN names; the
# table then adds the columns and the ratios R1/before, R3/before).
# A target that cannot be set up or mounted shows n/a; the script carries on.
# Rows (--rows, a comma-separated list of groups; default all): seq (write,
# cold and warm read, a second read by a new process), create (4 KiB files;
# durable ones with fsync, by 1 and by 4 processes), fsync, open, tree (tar x and
# rm -rf of a 10,000-file tree), ls (ls -l of a 100,000-entry directory),
# writers (1,000 against 10 concurrent writers of 1 MiB files). The table
# leaves out the rows of groups not asked for.
# After the runs, once: the lease manager at 10^3..10^6 leases (cargo bench
# --bench lease_bench) and daemon memory with 100 writers (writers_memory.sh).
# Prints one table with every figure of benches/README.md (medians of the runs, the
# goal and whether it is met) and keeps raw figures, fio JSON and logs in
# target/bench/<time>/. Benchmarks are reports, not tests: exit status is 0
# unless the script itself is misused.
#
# Environment: LEASEFS_BIN (default target/release/leasefs), BENCH_DIR (parent
# of the scratch directory, default /var/tmp: must be a real disk, not tmpfs),
# BENCH_OUT (output directory), FUSE_CEILING_DIR (default ../shared/tools/fuse-ceiling,
# else /work/shared/tools/fuse-ceiling).
set -uo pipefail

usage() {
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
}

runs=
quick=0
extra=1
targets_arg=native,fuse-ceiling,bindfs,leasefs-r1,leasefs-r3
all_groups=seq,create,fsync,open,tree,ls,writers
rows_arg=$all_groups
while [[ $# -gt 0 ]]; do
    case $1 in
        --runs) runs=${2:?--runs needs a number}; shift 2 ;;
        --runs=*) runs=${1#--runs=}; shift ;;
        --quick) quick=1; shift ;;
        --no-extra) extra=0; shift ;;
        --targets) targets_arg=${2:?--targets needs a list}; shift 2 ;;
        --targets=*) targets_arg=${1#--targets=}; shift ;;
        --rows) rows_arg=${2:?--rows needs a list}; shift 2 ;;
        --rows=*) rows_arg=${1#--rows=}; shift ;;
        -h | --help) usage; exit 0 ;;
        *) echo "run.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
    esac
done
[[ -z $runs || $runs =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: --runs needs a positive number" >&2; exit 2; }

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(git -C "$here" rev-parse --show-toplevel 2>/dev/null || (cd "$here/.." && pwd))

if [[ $quick -eq 1 ]]; then
    runs=${runs:-1}
    seq_mib=64; nfiles=1000; nfsync=200; nopen=500; ndurable=100
else
    runs=${runs:-3}
    seq_mib=1024; nfiles=10000; nfsync=2000; nopen=2000; ndurable=1000
fi
nwriters=100
# The many-file rows: a tree of tree_dirs x tree_per_dir files for tar x and
# rm -rf, a directory of nentries entries for ls -l, and writer_files
# writers of 1 MiB each, many_writers against few_writers at a time (see
# fig_writers).
if [[ $quick -eq 1 ]]; then
    tree_dirs=10; tree_per_dir=100; nentries=10000; many_writers=250
else
    tree_dirs=100; tree_per_dir=100; nentries=100000; many_writers=1000
fi
few_writers=10
writer_files=$many_writers

IFS=, read -r -a targets <<<"$targets_arg"
for t in "${targets[@]}"; do
    case $t in
        native | fuse-ceiling | bindfs | leasefs-r1 | leasefs-r3 | before-r1 | before-r3) ;;
        *) echo "run.sh: unknown target '$t'" >&2; exit 2 ;;
    esac
done

declare -A want=()   # row group -> 1 when measured
IFS=, read -r -a groups <<<"$rows_arg"
for g in "${groups[@]}"; do
    case ,$all_groups, in
        *,"$g",*) want[$g]=1 ;;
        *) echo "run.sh: unknown row group '$g' (groups: $all_groups)" >&2; exit 2 ;;
    esac
done

for tool in fio python3 findmnt fusermount3 tar; do
    command -v "$tool" >/dev/null 2>&1 || { echo "run.sh: $tool is required" >&2; exit 2; }
done

bin=${LEASEFS_BIN:-$root/target/release/leasefs}
before_bin=${LEASEFS_BEFORE_BIN:-}
bin_of() { # TARGET -> the leasefs build it mounts
    case $1 in before-*) echo "$before_bin" ;; *) echo "$bin" ;; esac
}
out=${BENCH_OUT:-$root/target/bench/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out/fio" "$out/logs"
results=$out/results.tsv
: >"$results"
notes=$out/notes.txt
: >"$notes"

work=$(mktemp -d "${BENCH_DIR:-/var/tmp}/leasefs-bench.XXXXXX")

log() { printf '[bench] %s\n' "$*" >&2; }
note() { printf '%s\n' "$*" >>"$notes"; log "$*"; }

# --- mounts and cleanup --------------------------------------------------------
declare -A mounted=()    # mount dir -> 1
fc_pid=
fc_bin=

is_mounted() { findmnt -rn -M "$1" >/dev/null 2>&1; }

wait_mounted() { # DIR TIMEOUT_TENTHS [PID]
    local dir=$1 n=$2 pid=${3:-}
    while ((n-- > 0)); do
        is_mounted "$dir" && return 0
        [[ -z $pid ]] || kill -0 "$pid" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}

fuse_unmount() { # DIR
    local dir=$1
    if is_mounted "$dir"; then
        for _ in 1 2 3 4 5 6 7 8 9 10; do
            fusermount3 -u "$dir" 2>/dev/null && break
            sleep 0.5
        done
        if is_mounted "$dir"; then
            log "unmount of $dir busy: lazy unmount"
            fusermount3 -u -z "$dir" 2>/dev/null || umount -l "$dir" 2>/dev/null
        fi
    fi
    unset 'mounted[$dir]'
}

stop_fc() {
    [[ -n $fc_pid ]] || return 0
    for _ in $(seq 1 100); do
        kill -0 "$fc_pid" 2>/dev/null || break
        sleep 0.1
    done
    kill "$fc_pid" 2>/dev/null
    wait "$fc_pid" 2>/dev/null
    fc_pid=
}

# shellcheck disable=SC2317  # called from the EXIT trap
cleanup() {
    local d
    for d in "${!mounted[@]}"; do fuse_unmount "$d"; done
    stop_fc
    if [[ -n $(findmnt -rn -o TARGET | grep -F "$work/" || true) ]]; then
        log "something is still mounted under $work; leaving it"
    else
        rm -rf --one-file-system "$work"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

can_drop_caches=0
if [[ -w /proc/sys/vm/drop_caches ]]; then
    can_drop_caches=1
else
    note "cannot write /proc/sys/vm/drop_caches (not root): cold reads are n/a, and a turn's deletions may slow the next target's creates"
fi
drop_caches() {
    sync
    [[ $can_drop_caches -eq 1 ]] && echo 3 >/proc/sys/vm/drop_caches
}

# --- targets -------------------------------------------------------------------
declare -A label=(
    [native]="native" [fuse-ceiling]="fuse-ceiling" [bindfs]="bindfs"
    [leasefs-r1]="leasefs R=1" [leasefs-r3]="leasefs R=3"
    [before-r1]="before R=1" [before-r3]="before R=3"
)
declare -A usable=()   # target -> 1 when it can be tried
declare -A tdir=()     # target -> directory the figures run in

prepare_target() { # TARGET: one-time checks/builds
    local t=$1
    case $t in
        native) usable[$t]=1 ;;
        fuse-ceiling)
            local fcdir=${FUSE_CEILING_DIR:-}
            if [[ -z $fcdir ]]; then
                # ../shared beside the checkout, else the workplace's copy
                # (a fresh clone may live anywhere).
                for d in "$root/../shared/tools/fuse-ceiling" /work/shared/tools/fuse-ceiling; do
                    if [[ -x $d/build.sh ]]; then fcdir=$d; break; fi
                done
                fcdir=${fcdir:-$root/../shared/tools/fuse-ceiling}
            fi
            if [[ ! -x $fcdir/build.sh ]]; then
                note "fuse-ceiling: $fcdir/build.sh not found: n/a"
                return
            fi
            log "building fuse-ceiling"
            if fc_bin=$("$fcdir/build.sh" 2>"$out/logs/fuse-ceiling-build.log") && [[ -x $fc_bin ]]; then
                usable[$t]=1
            else
                note "fuse-ceiling: build failed (see $out/logs/fuse-ceiling-build.log): n/a"
            fi
            ;;
        bindfs)
            if command -v bindfs >/dev/null 2>&1; then
                usable[$t]=1
            else
                note "bindfs: not installed (apt-get install bindfs): n/a"
            fi
            ;;
        leasefs-r1 | leasefs-r3 | before-r1 | before-r3)
            local b
            b=$(bin_of "$t")
            if [[ -n $b && -x $b ]]; then
                usable[$t]=1
            else
                note "${label[$t]}: no binary at '${b}' (LEASEFS_BIN / LEASEFS_BEFORE_BIN): n/a"
            fi
            ;;
    esac
}

mount_target() { # TARGET RUN [ATTEMPTS] -> sets tdir[TARGET]; non-zero when it cannot mount
    local t=$1 run=$2 attempts=${3:-1} base=$work/$1 mnt
    mnt=$base/mnt
    case $t in
        native)
            mkdir -p "$base/dir"
            tdir[$t]=$base/dir
            return 0
            ;;
        fuse-ceiling)
            mkdir -p "$mnt" "$base/backing"
            "$fc_bin" file "$mnt" --threads 2 --backing "$base/backing" \
                >>"$out/logs/fuse-ceiling.log" 2>&1 &
            fc_pid=$!
            if ! wait_mounted "$mnt" 100 "$fc_pid"; then
                note "fuse-ceiling: did not mount (run $run, see logs/fuse-ceiling.log)"
                kill "$fc_pid" 2>/dev/null; wait "$fc_pid" 2>/dev/null; fc_pid=
                return 1
            fi
            ;;
        bindfs)
            mkdir -p "$mnt" "$base/src"
            if ! bindfs -o big_writes "$base/src" "$mnt" >>"$out/logs/bindfs.log" 2>&1; then
                note "bindfs: mount failed (run $run, see logs/bindfs.log)"
                return 1
            fi
            ;;
        leasefs-r1 | leasefs-r3 | before-r1 | before-r3)
            local r=${t##*-r} i args b
            b=$(bin_of "$t")
            mkdir -p "$mnt" "$base/data"
            args=(mount "$mnt" --data "$base/data")
            for ((i = 1; i <= r; i++)); do
                mkdir -p "$base/dn$i"
                args+=(--datanode "$base/dn$i")
            done
            args+=(--replication "$r")
            # A daemon that was just unmounted may still hold its data dir for a
            # moment: a remount is tried ATTEMPTS times, a second apart.
            local ok=0 msg k
            for ((k = 0; k < attempts; k++)); do
                ((k == 0)) || sleep 1
                echo "+ $b ${args[*]}" >>"$out/logs/$t.log"
                # Output to a file, not a pipe: a daemon that kept the pipe open
                # would make $(...) wait for it forever.
                timeout 60 "$b" "${args[@]}" >"$out/logs/$t.last" 2>&1
                local rc=$?
                msg=$(head -c 2000 "$out/logs/$t.last")
                cat "$out/logs/$t.last" >>"$out/logs/$t.log"
                if [[ $rc -eq 0 ]] && wait_mounted "$mnt" 50; then
                    ok=1
                    break
                fi
                if [[ $rc -eq 0 ]]; then
                    msg="exited 0 but nothing is mounted on $mnt"
                elif [[ -z $msg ]]; then
                    msg="exit status $rc, no message"
                else
                    msg="exit status $rc: $msg"
                fi
                fuse_unmount "$mnt"
            done
            if [[ $ok -ne 1 ]]; then
                note "${label[$t]}: mount failed (run $run): $(printf '%s' "$msg" | head -n1)"
                return 1
            fi
            ;;
    esac
    mounted[$mnt]=1
    # The figures run in the mount's root: fuse-ceiling has a flat namespace
    # (no mkdir), so no target gets subdirectories.
    tdir[$t]=$mnt
}

unmount_target() { # TARGET
    local t=$1 mnt=$work/$1/mnt
    case $t in
        native) ;;
        fuse-ceiling) fuse_unmount "$mnt"; stop_fc ;;
        *) fuse_unmount "$mnt" ;;
    esac
}

# Make the next read cold: drop the page cache; targets that keep their files
# across a remount are unmounted and mounted again first (fuse-ceiling keeps its
# namespace in memory, so it is only dropped from the cache).
make_cold() { # TARGET RUN
    local t=$1 run=$2
    case $t in
        native | fuse-ceiling) drop_caches ;;
        *)
            unmount_target "$t"
            drop_caches
            mount_target "$t" "$run" 10
            ;;
    esac
}

# --- figures -------------------------------------------------------------------
declare -A recorded=()  # "RUN TARGET FIGURE" -> 1 once recorded
record() { # RUN TARGET FIGURE VALUE
    printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${4:-NA}" >>"$results"
    recorded["$1 $2 $3"]=1
}

fio_json() { # FILE EXPR -> prints python expression over j (jobs[0])
    python3 - "$1" "$2" <<'PY' 2>/dev/null
import json, sys
try:
    j = json.load(open(sys.argv[1]))["jobs"][0]
    print(eval(sys.argv[2], {"j": j}))
except Exception:
    pass
PY
}

fio_run() { # JSON_OUT FIO_ARGS...
    local json=$1
    shift
    fio --ioengine=psync --fallocate=none --invalidate=0 --output-format=json \
        --output="$json" "$@" >>"$out/logs/fio.log" 2>&1
}

# One sequential read of FILE in 1 MiB reads (fio job NAME, with any more
# fio options), recorded as FIGURE in MB/s, or NA when fio failed.
fig_read() { # RUN TARGET FIGURE NAME FILE [FIO OPTION...]
    local run=$1 t=$2 fig=$3 name=$4 f=$5 js
    shift 5
    js=$out/fio/$t-run$run-$name.json
    if fio_run "$js" --name="$name" --filename="$f" --rw=read --bs=1M --size="${seq_mib}M" "$@"; then
        record "$run" "$t" "$fig" "$(fio_json "$js" 'round(j["read"]["bw_bytes"] / 1e6, 1)')"
    else
        record "$run" "$t" "$fig" NA
    fi
}

fig_seq() { # RUN TARGET DIR
    local run=$1 t=$2 dir=$3 f=$3/seq.dat js
    rm -f "$f"
    js=$out/fio/$t-run$run-seqwrite.json
    if fio_run "$js" --name=seqwrite --filename="$f" --rw=write --bs=1M \
        --size="${seq_mib}M" --end_fsync=1; then
        record "$run" "$t" seq_write "$(fio_json "$js" 'round(j["write"]["bw_bytes"] / 1e6, 1)')"
    else
        record "$run" "$t" seq_write NA
        note "${label[$t]}: sequential write failed (run $run, see logs/fio.log)"
        return
    fi
    if [[ $can_drop_caches -eq 1 ]] && make_cold "$t" "$run"; then
        f=${tdir[$t]}/seq.dat
        fig_read "$run" "$t" seq_read_cold readcold "$f"
    else
        record "$run" "$t" seq_read_cold NA
        is_mounted "$work/$t/mnt" || [[ $t == native ]] || return 1
    fi
    f=${tdir[$t]}/seq.dat
    fig_read "$run" "$t" seq_read_warm readwarm "$f"
    # The same read with the file's own pages dropped first (fio's
    # invalidate: POSIX_FADV_DONTNEED at open), the replicas left in the
    # backing filesystem's page cache: what the daemon serves from memory
    # (leasefs' warm read above keeps the file's pages, FOPEN_KEEP_CACHE).
    # leasefs reads replicas the page cache does not hold past it
    # (replica_reads=direct), so the cold read above left them on disk:
    # they are read once here (the datanodes' files, outside the mount) to
    # measure what this row is about, the daemon serving replicas from
    # memory. (With them on disk, the daemon reads them again: that is the
    # cold row's path.) Through find and xargs: the earlier runs' small
    # files leave tens of thousands of replicas there, more names than one
    # command line holds (a glob once failed there unseen, and the row
    # measured reads from the disk in every run but the first).
    case $t in
        leasefs-* | before-*)
            find "$work/$t"/dn*/finalized -name 'blk_*' -print0 | xargs -0r cat >/dev/null
            ;;
    esac
    fig_read "$run" "$t" seq_read_daemon readdaemon "$f" --invalidate=1
    # The same read again with the machine's free memory touched first, as
    # much as three such files: on this VM freed memory goes back to the
    # host (virtio_balloon free page reporting) and a page-cache page taken
    # from it faults in the host on first touch. The read above fills
    # fresh pages for the file; fuse-ceiling and native reuse the pages
    # their `--invalidate` freed an instant before (their writes cached
    # the file), leasefs' writes are direct_io and leave none to reuse
    # (benches/PROFILE.md, "Reads the daemon serves from memory (issue 28,
    # fourth look)"). Touched for every target alike, this row measures
    # the serving, not the host's faults.
    python3 -c "b = bytearray(3 * $seq_mib << 20)"
    fig_read "$run" "$t" seq_read_touched readtouched "$f" --invalidate=1
    # A second read of the closed file by a new process, caches kept: what
    # `cat f` after `cp f` does (fio above drops the file's own pages).
    # Issue 28 asks that it stay a page-cache read: on leasefs, the bytes
    # the daemon served meanwhile (`stats`) are recorded too, and must be 0.
    cat "$f" >/dev/null 2>&1
    local served_before=""
    case $t in leasefs-* | before-*) served_before=$(daemon_bytes_read "$t") ;; esac
    record "$run" "$t" seq_read_again "$(python3 - "$f" <<'PY'
import os, sys, time
t0 = time.perf_counter()
n = 0
with open(sys.argv[1], "rb", buffering=0) as f:
    while True:
        b = f.read(1 << 20)
        if not b:
            break
        n += len(b)
print(round(n / (time.perf_counter() - t0) / 1e6, 1))
PY
    )" || record "$run" "$t" seq_read_again NA
    if [[ -n $served_before ]]; then
        local served_after
        served_after=$(daemon_bytes_read "$t")
        if [[ -n $served_after ]]; then
            record "$run" "$t" seq_read_again_daemon $(((served_after - served_before) >> 20))
        fi
    fi
    rm -f "$f"
    wait_replicas_gone "$t" "$run"
}

# leasefs deletes a removed file's replicas in a background worker once the
# metadata is durable (docs/SEMANTICS.md, "Order on disk"): after `rm` of
# the 1 GiB file that is R GiB still to free (with this disk's `discard`),
# which native's and bindfs' `rm` did before returning. Waiting for it
# (at most 60 s) keeps it out of the next row's timed window, as every
# turn's end already keeps the turn's deletions out of the next target's:
# 3,000 small files at R=3 right after such an `rm` ran at 900 files/s for
# their first 500 against 1,500-2,700 without it (PROFILE, "eighth look").
wait_replicas_gone() { # TARGET
    case $1 in leasefs-* | before-*) ;; *) return 0 ;; esac
    local k
    for ((k = 0; k < 600; k++)); do
        [[ -z $(find "$work/$1"/dn* -name 'blk_*' -size +1M -print -quit 2>/dev/null) ]] && return 0
        sleep 0.1
    done
    note "${label[$1]}: replicas of a removed file still on disk 60 s after its rm (run $2)"
}

daemon_bytes_read() { # TARGET -> bytes its daemon has returned by read() so far
    "$(bin_of "$1")" stats --once --json "$work/$1/mnt" 2>/dev/null |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["bytes_read"])' 2>/dev/null
}

fig_small_files() { # RUN TARGET DIR
    local run=$1 t=$2 d=$3 v
    # Files go straight into DIR (no subdirectory: see mount_target), named
    # small-rRUN-NNNNNN, and stay until the scratch directory is removed at
    # the end. Deleting them here would bill the next target: ext4 without
    # a journal (as /var/tmp is here) will not reuse an inode freed in the
    # last 60-300 s, and every create then scans past the freed ones
    # (recently_deleted() in perf), so a create loop run after 10,000
    # unlinks ran at a fraction of its speed.
    sync
    v=$(python3 - "$d" "$nfiles" "$run" <<'PY'
import os, sys, time
d, n, run = sys.argv[1], int(sys.argv[2]), sys.argv[3]
buf = b"x" * 4096
flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY
t0 = time.perf_counter()
for i in range(n):
    fd = os.open(f"{d}/small-r{run}-{i:06d}", flags, 0o644)
    if os.write(fd, buf) != len(buf):
        sys.exit("short write")
    os.close(fd)
print(round(n / (time.perf_counter() - t0)))
PY
    ) || { v=NA; note "${label[$t]}: small-file loop failed (run $run)"; }
    record "$run" "$t" create_4k "$v"
}

fig_durable_files() { # RUN TARGET DIR
    local run=$1 t=$2 d=$3 procs v
    # create + 4 KiB write + fsync + close, by one process and by four at
    # once (each its own files): the rate of durable small files, and how
    # it scales when writers' syncs and commits can be grouped. A `sync`
    # first, as before every many-file figure: the row before leaves tens
    # of thousands of unsynced files (replicas, on leasefs), and leasefs'
    # journal checkpoint, whose `syncfs` writes back whatever is dirty on
    # the datanode's filesystem, would otherwise bill their write-back to
    # this row (R=3 900-1,030 against 1,390-1,550 files/s; PROFILE.md,
    # "eighth look"), where bindfs' write-back waits for the kernel's
    # 30 s expiry.
    for procs in 1 4; do
        sync
        v=$(python3 - "$d" "$ndurable" "$run" "$procs" <<'PY'
import os, sys, time
from multiprocessing import Process
d, n, run, procs = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
buf = b"x" * 4096
flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY
def work(p):
    for i in range(n // procs):
        fd = os.open(f"{d}/durable-r{run}-p{procs}-{p}-{i:06d}", flags, 0o644)
        if os.write(fd, buf) != len(buf):
            sys.exit("short write")
        os.fsync(fd)
        os.close(fd)
ps = [Process(target=work, args=(p,)) for p in range(procs)]
t0 = time.perf_counter()
for p in ps:
    p.start()
for p in ps:
    p.join()
    if p.exitcode != 0:
        sys.exit("a writer failed")
print(round((n // procs) * procs / (time.perf_counter() - t0)))
PY
        ) || { v=NA; note "${label[$t]}: durable small-file loop failed ($procs writers, run $run)"; }
        record "$run" "$t" "durable_4k_$procs" "$v"
    done
}

fig_fsync() { # RUN TARGET DIR
    local run=$1 t=$2 f=$3/fsync.dat js
    rm -f "$f"
    js=$out/fio/$t-run$run-fsync.json
    if fio_run "$js" --name=fsync --filename="$f" --rw=write --bs=4k \
        --size="$((nfsync * 4))k" --fsync=1; then
        record "$run" "$t" fsync_p50 "$(fio_json "$js" 'round(j["sync"]["lat_ns"]["percentile"]["50.000000"] / 1e3)')"
        record "$run" "$t" fsync_p99 "$(fio_json "$js" 'round(j["sync"]["lat_ns"]["percentile"]["99.000000"] / 1e3)')"
    else
        record "$run" "$t" fsync_p50 NA
        record "$run" "$t" fsync_p99 NA
        note "${label[$t]}: fsync job failed (run $run, see logs/fio.log)"
    fi
    rm -f "$f"
}

fig_open() { # RUN TARGET DIR
    local run=$1 t=$2 f=$3/open.dat line
    rm -f "$f"
    if line=$(python3 - "$f" "$nopen" <<'PY'
import os, statistics, sys, time
path, n = sys.argv[1], int(sys.argv[2])
fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
os.write(fd, b"x" * 4096)
os.close(fd)
def loop(flags):
    ts = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        fd = os.open(path, flags)
        os.close(fd)
        ts.append(time.perf_counter_ns() - t0)
    return statistics.median(ts) / 1e3
# Alternate the two kinds in blocks so drift affects both alike.
w, r = [], []
for _ in range(4):
    w.append(loop(os.O_WRONLY))
    r.append(loop(os.O_RDONLY))
w, r = statistics.median(w), statistics.median(r)
print(f"{w:.1f} {r:.1f} {w / r:.2f}")
PY
    ); then
        read -r ow or ratio <<<"$line"
        record "$run" "$t" open_w "$ow"
        record "$run" "$t" open_r "$or"
        record "$run" "$t" open_ratio "$ratio"
    else
        record "$run" "$t" open_w NA
        record "$run" "$t" open_r NA
        record "$run" "$t" open_ratio NA
        note "${label[$t]}: open loop failed (run $run)"
    fi
    rm -f "$f"
}

# --- many-file figures: tar x, ls -l, concurrent writers, rm -rf ----------------
# They run after the figures above, in this order, and each timed window
# starts after a `sync`, so that no earlier figure's writeback lands in it.
# rm -rf comes last: an inode freed on ext4 without a journal is not reused
# while its inode table block is cached and its deletion recent, so every
# create after many deletions scans past them (see fig_small_files). The
# deletions of a turn are billed to nobody: end_turn waits for the daemon
# to exit (leasefs deletes replicas in the background), syncs and drops the
# caches, which forgets them (benches/README.md, "Deletions are billed to
# nobody").

# Elapsed time of the command after `--`, in microseconds; its status.
# $EPOCHREALTIME with the decimal point removed: microseconds, no fork.
time_us() { # VAR -- CMD...
    local var=$1 t0 t1 rc
    shift 2
    t0=${EPOCHREALTIME/[.,]/}
    "$@"
    rc=$?
    t1=${EPOCHREALTIME/[.,]/}
    printf -v "$var" '%s' $((t1 - t0))
    return $rc
}

per_second() { # COUNT MICROSECONDS
    awk -v n="$1" -v us="$2" 'BEGIN { if (us > 0) printf "%.0f", n * 1e6 / us; else print "NA" }'
}

# FUSE targets are unmounted and mounted again, so the kernel holds no
# dentry or attribute of theirs; native stays as it is (nothing to forget
# but its own inode cache, which a listing of ext4 has in any case).
remount_target() { # TARGET RUN
    local t=$1 run=$2 pid
    [[ $t == native ]] && return 0
    pid=$(daemon_pid "$t")
    unmount_target "$t"
    wait_daemon "$t" "$pid"
    mount_target "$t" "$run" 10
}

daemon_pid() { # TARGET -> pid of its leasefs daemon, if any
    case $1 in
        leasefs-* | before-*) awk '{print $2; exit}' "$work/$1/data/lock" 2>/dev/null ;;
    esac
}

wait_daemon() { # TARGET PID: after the unmount, until the daemon has exited
    local t=$1 pid=$2 n=1200
    [[ -n $pid ]] || return 0
    while ((n-- > 0)) && kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && note "${label[$t]}: daemon $pid still running 120 s after the unmount"
}

fig_tree_x() { # RUN TARGET DIR
    local run=$1 t=$2 d=$3/tree-r$1 us
    if [[ $t == fuse-ceiling || -z $tree_tar ]]; then
        record "$run" "$t" tar_x NA
        return
    fi
    if ! mkdir "$d"; then
        note "${label[$t]}: mkdir for tar x failed (run $run)"
        record "$run" "$t" tar_x NA
        return
    fi
    cat "$tree_tar" >/dev/null # read from the page cache in the timed window
    sync
    if time_us us -- tar -xf "$tree_tar" -C "$d" 2>>"$out/logs/tar.log"; then
        record "$run" "$t" tar_x "$(per_second "$tree_files" "$us")"
    else
        record "$run" "$t" tar_x NA
        note "${label[$t]}: tar x failed (run $run, see logs/tar.log)"
    fi
}

fig_ls() { # RUN TARGET DIR
    local run=$1 t=$2 d=$3/ls-r$1 us
    if [[ $t == fuse-ceiling ]]; then
        record "$run" "$t" ls_l NA
        return
    fi
    # The entries stay until the end, like the small files.
    if ! { mkdir "$d" && python3 "$here/many_files.py" entries "$d" "$nentries" >/dev/null 2>>"$out/logs/ls.log"; }; then
        note "${label[$t]}: making $nentries entries for ls -l failed (run $run, see logs/ls.log)"
        record "$run" "$t" ls_l NA
        return
    fi
    sync
    remount_target "$t" "$run" || return 1
    d=${tdir[$t]}/ls-r$run
    if time_us us -- ls -l "$d" >/dev/null 2>>"$out/logs/ls.log"; then
        record "$run" "$t" ls_l "$(awk -v us="$us" 'BEGIN { printf "%.3f", us / 1e6 }')"
    else
        record "$run" "$t" ls_l NA
        note "${label[$t]}: ls -l failed (run $run, see logs/ls.log)"
    fi
}

fig_writers() { # RUN TARGET DIR
    local run=$1 t=$2 d=$3 few many
    # writer_files writers of one 1 MiB file each, processes: few_writers
    # at a time, then many_writers at a time (all at once). The files, the
    # bytes and the cost of a writer in many_files.py are the same; only
    # the concurrency differs. The files are deleted at the turn's end.
    sync
    few=$(python3 "$here/many_files.py" writers "$d" "wf-r$run" "$writer_files" "$few_writers" \
        2>>"$out/logs/writers.log") ||
        { few=NA; note "${label[$t]}: $few_writers writers at a time failed (run $run, see logs/writers.log)"; }
    sync
    many=$(python3 "$here/many_files.py" writers "$d" "wm-r$run" "$writer_files" "$many_writers" \
        2>>"$out/logs/writers.log") ||
        { many=NA; note "${label[$t]}: $many_writers writers at a time failed (run $run, see logs/writers.log)"; }
    sync
    record "$run" "$t" writers_few "$few"
    record "$run" "$t" writers_many "$many"
    if [[ $few != NA && $many != NA ]]; then
        record "$run" "$t" writers_ratio "$(awk -v a="$many" -v b="$few" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "NA" }')"
    else
        record "$run" "$t" writers_ratio NA
    fi
}

fig_tree_rm() { # RUN TARGET DIR
    local run=$1 t=$2 us d
    if [[ $t == fuse-ceiling || -z $tree_tar || ! -d $3/tree-r$run/tree ]]; then
        record "$run" "$t" rm_rf NA
        return
    fi
    # From a fresh mount, whatever ran before it (see remount_target).
    sync
    remount_target "$t" "$run" || return 1
    d=${tdir[$t]}/tree-r$run
    if time_us us -- rm -rf "$d/tree" 2>>"$out/logs/tar.log"; then
        record "$run" "$t" rm_rf "$(per_second "$tree_files" "$us")"
    else
        record "$run" "$t" rm_rf NA
        note "${label[$t]}: rm -rf failed (run $run, see logs/tar.log)"
    fi
}

# The end of a target's turn: the writers' files are deleted (untimed),
# the target unmounted, its daemon waited for (leasefs deletes replicas
# in the background and finishes before it exits), and the disk synced and
# the caches dropped: that leaves the next target a clean start and no
# recently freed inode in the buffer cache to scan past.
end_turn() { # RUN TARGET
    local run=$1 t=$2 pid
    if [[ -n ${want[writers]:-} && -n ${tdir[$t]:-} ]] && { [[ $t == native ]] || is_mounted "$work/$t/mnt"; }; then
        find "${tdir[$t]}" -maxdepth 1 \( -name "wf-r$run-*" -o -name "wm-r$run-*" \) -delete 2>/dev/null
    fi
    pid=$(daemon_pid "$t")
    unmount_target "$t"
    wait_daemon "$t" "$pid"
    drop_caches
}

# Figures of leasefs alone, measured once after the runs: the lease
# manager at scale, and daemon memory with many concurrent writers.
fig_lease() {
    local sizes=1000,1000000 n acq renew tick rel bytes
    [[ $quick -eq 1 ]] || sizes=1000,100000,1000000
    if ! command -v cargo >/dev/null 2>&1; then
        note "lease manager: cargo not found: n/a"
        return
    fi
    log "lease manager: $sizes leases (cargo bench --bench lease_bench)"
    if (cd "$root" && timeout 900 cargo bench -q --bench lease_bench -- --tsv --sizes "$sizes") \
        >"$out/logs/lease_bench.tsv" 2>"$out/logs/lease_bench.log"; then
        while IFS=$'\t' read -r n acq renew tick rel bytes; do
            [[ $n =~ ^[0-9]+$ ]] || continue
            record 1 lease "lease_acquire_$n" "$acq"
            record 1 lease "lease_renew_$n" "$renew"
            record 1 lease "lease_tick_$n" "$tick"
            record 1 lease "lease_release_$n" "$rel"
            record 1 lease "lease_bytes_$n" "$bytes"
        done <"$out/logs/lease_bench.tsv"
    else
        note "lease manager: cargo bench failed (see logs/lease_bench.log): n/a"
    fi
}

fig_memory() {
    local mib=8 line kv
    [[ $quick -eq 1 ]] && mib=4
    if [[ ! -x $bin ]]; then
        note "daemon memory: no binary at $bin: n/a"
        return
    fi
    log "daemon memory: $nwriters writers of $mib MiB each (benches/writers_memory.sh)"
    if LEASEFS_BIN=$bin BENCH_DIR=$work timeout 600 "$here/writers_memory.sh" "$nwriters" "$mib" \
        >"$out/logs/writers_memory.log" 2>&1 &&
        line=$(grep '^result ' "$out/logs/writers_memory.log"); then
        for kv in $line; do
            case $kv in
                base_kib=*) record 1 leasefs-r3 mem_base "${kv#*=}" ;;
                peak_kib=*) record 1 leasefs-r3 mem_peak "${kv#*=}" ;;
                bound_kib=*) record 1 leasefs-r3 mem_bound "${kv#*=}" ;;
            esac
        done
    else
        note "daemon memory: writers_memory.sh failed (see logs/writers_memory.log): n/a"
    fi
}

declare -A group_figures=(
    [seq]="seq_write seq_read_cold seq_read_warm seq_read_daemon seq_read_touched seq_read_again seq_read_again_daemon" [create]="create_4k durable_4k_1 durable_4k_4"
    [fsync]="fsync_p50 fsync_p99" [open]="open_w open_r open_ratio"
    [tree]="tar_x rm_rf" [ls]="ls_l" [writers]="writers_few writers_many writers_ratio"
)
all_figures=()
for g in ${all_groups//,/ }; do
    if [[ -n ${want[$g]:-} ]]; then
        read -r -a figs <<<"${group_figures[$g]}"
        all_figures+=("${figs[@]}")
    fi
done

run_target() { # RUN TARGET
    local run=$1 t=$2 fig lost=
    if [[ -z ${usable[$t]:-} ]] || ! mount_target "$t" "$run"; then
        for fig in "${all_figures[@]}"; do record "$run" "$t" "$fig" NA; done
        # Not mountable now: not worth trying again in later runs.
        [[ -z ${usable[$t]:-} ]] || note "${label[$t]}: skipped in the remaining runs"
        unset 'usable[$t]'
        return
    fi
    log "run $run: ${label[$t]}"
    local d=${tdir[$t]}
    if [[ -n ${want[seq]:-} ]] && ! fig_seq "$run" "$t" "$d"; then
        lost="the cold-read remount"
    fi
    if [[ -z $lost ]]; then
        [[ -z ${want[create]:-} ]] || fig_small_files "$run" "$t" "$d"
        [[ -z ${want[create]:-} ]] || fig_durable_files "$run" "$t" "$d"
        [[ -z ${want[fsync]:-} ]] || fig_fsync "$run" "$t" "$d"
        [[ -z ${want[open]:-} ]] || fig_open "$run" "$t" "$d"
        [[ -z ${want[tree]:-} ]] || fig_tree_x "$run" "$t" "$d"
        if [[ -n ${want[ls]:-} ]] && ! fig_ls "$run" "$t" "$d"; then
            lost="the remount before ls -l"
        fi
    fi
    if [[ -z $lost ]]; then
        [[ -z ${want[writers]:-} ]] || fig_writers "$run" "$t" "$d"
        if [[ -n ${want[tree]:-} ]] && ! fig_tree_rm "$run" "$t" "$d"; then
            lost="the remount before rm -rf"
        fi
    fi
    if [[ -n $lost ]]; then
        note "${label[$t]}: lost its mount during $lost (run $run)"
        for fig in "${all_figures[@]}"; do
            [[ -n ${recorded["$run $t $fig"]:-} ]] || record "$run" "$t" "$fig" NA
        done
    fi
    end_turn "$run" "$t"
    # The rest of the scratch data stays until the end (see fig_small_files).
}

# --- main ------------------------------------------------------------------------
fstype=$(findmnt -rn -T "$work" -o FSTYPE | tail -n1)
# leasefs as setup.sh leaves it: FUSE over io_uring enabled where the
# kernel has it (the other targets never ask for it).
uring=$("$root/mount-scripts/fuse-uring.sh" 2>&1)
{
    echo "leasefs benchmark $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "host: $(uname -srm), $(nproc) CPUs, scratch $work ($fstype)"
    echo "leasefs: $bin${before_bin:+ (before: $before_bin)}"
    echo "transport: $uring"
    echo "mode: $([[ $quick -eq 1 ]] && echo quick || echo full), runs $runs, seq ${seq_mib} MiB, $nfiles files, $nfsync fsyncs, $nopen opens, tree $tree_dirs x $tree_per_dir files, ls $nentries entries, $writer_files writers of 1 MiB $many_writers vs $few_writers at a time$([[ $extra -eq 1 ]] && echo ", lease manager, $nwriters writers' memory")"
    echo "rows: $rows_arg"
} | tee "$out/header.txt" >&2
[[ $fstype != tmpfs ]] || note "warning: scratch directory is on tmpfs; set BENCH_DIR to a disk"

for t in "${targets[@]}"; do prepare_target "$t"; done
if [[ -n ${usable[fuse-ceiling]:-} ]] && [[ -n ${want[tree]:-} || -n ${want[ls]:-} ]]; then
    note "fuse-ceiling: tar x, rm -rf and ls -l are n/a: its namespace is flat (no mkdir) and lives in memory (no remount keeps it)"
fi

# The tree for tar x, once per benchmark run, outside the mounts (built in
# memory: making it creates and deletes no file on the disk).
tree_tar=
tree_files=$((tree_dirs * tree_per_dir))
if [[ -n ${want[tree]:-} ]]; then
    if python3 "$here/many_files.py" archive "$work/tree.tar" "$tree_dirs" "$tree_per_dir" \
        >/dev/null 2>>"$out/logs/tar.log"; then
        tree_tar=$work/tree.tar
    else
        note "tar x, rm -rf: making the archive failed (see logs/tar.log): n/a"
    fi
fi
drop_caches # every turn starts as after end_turn

for ((run = 1; run <= runs; run++)); do
    # Interleave: rotate the target order every run.
    n=${#targets[@]}
    for ((k = 0; k < n; k++)); do
        run_target "$run" "${targets[$(((k + run - 1) % n))]}"
    done
done

if [[ $extra -eq 1 ]]; then
    fig_lease
    fig_memory
fi

python3 - "$results" "$seq_mib" "$nwriters" "$rows_arg" "$tree_files" "$nentries" "$many_writers" "$few_writers" <<'PY' | tee "$out/table.txt"
import csv, statistics, sys
path, seq_mib, nwriters = sys.argv[1], int(sys.argv[2]), sys.argv[3]
groups = set(sys.argv[4].split(","))
tree_files, nentries, many, few = (int(a) for a in sys.argv[5:9])
size = f"{seq_mib // 1024} GiB" if seq_mib >= 1024 else f"{seq_mib} MiB"
NAT, FC, BF, R1, R3 = "native", "fuse-ceiling", "bindfs", "leasefs-r1", "leasefs-r3"
vals = {}
for run, target, fig, v in csv.reader(open(path), delimiter="\t"):
    if v not in ("", "NA"):
        try:
            vals.setdefault((fig, target), []).append(float(v))
        except ValueError:
            pass
med = {k: statistics.median(v) for k, v in vals.items()}

def rel(fig, t, base, k, op):
    """t's figure against k x base's (base None: against k itself)."""
    a = med.get((fig, t))
    b = 1.0 if base is None else med.get((fig, base))
    if a is None or b is None:
        return None
    return a >= k * b if op == ">=" else a <= k * b

def ge(fig, t, base, k):
    return lambda: rel(fig, t, base, k, ">=")

def le(fig, t, base, k):
    return lambda: rel(fig, t, base, k, "<=")

def zero(fig, t):
    return lambda: None if med.get((fig, t)) is None else med[(fig, t)] == 0

def tick_flat():
    a, b = med.get(("lease_tick_1000000", "lease")), med.get(("lease_tick_1000", "lease"))
    return None if a is None or b is None else a <= 2 * b

def mem_bounded():
    a, b = med.get(("mem_peak", R3)), med.get(("mem_bound", R3))
    return None if a is None or b is None else a <= b

def durable_scales():
    ok = []
    for t in (R1, R3):
        a, b = med.get(("durable_4k_4", t)), med.get(("durable_4k_1", t))
        if a is not None and b is not None:
            ok.append(a >= 1.8 * b)
    return all(ok) if ok else None

bound = med.get(("mem_bound", R3))
# (figure, name, better, goal, checks, where the value shows)
rows = [
    ("seq_write", f"seq write {size} 1M+fsync MB/s", "higher",
     "R1>=0.9xfc,>=1.3xbindfs; R3>=0.3xfc",
     [ge("seq_write", R1, FC, 0.9), ge("seq_write", R1, BF, 1.3), ge("seq_write", R3, FC, 0.3)], None),
    ("seq_read_cold", "seq read cold MB/s", "higher", ">=0.9xnative",
     [ge("seq_read_cold", R1, NAT, 0.9), ge("seq_read_cold", R3, NAT, 0.9)], None),
    ("seq_read_warm", "seq read warm MB/s", "higher", ">=0.9xnative",
     [ge("seq_read_warm", R1, NAT, 0.9), ge("seq_read_warm", R3, NAT, 0.9)], None),
    ("seq_read_daemon", "seq read, file's pages dropped MB/s", "higher", ">=0.9xfc",
     [ge("seq_read_daemon", R1, FC, 0.9), ge("seq_read_daemon", R3, FC, 0.9)], None),
    ("seq_read_touched", "  the same, free memory touched first", "higher", ">=0.9xfc",
     [ge("seq_read_touched", R1, FC, 0.9), ge("seq_read_touched", R3, FC, 0.9)], None),
    ("seq_read_again", "seq read again, new process MB/s", "higher", "-", [], None),
    ("seq_read_again_daemon", "  of it served by the daemon, MiB", "lower", "0: page cache",
     [zero("seq_read_again_daemon", R1), zero("seq_read_again_daemon", R3)], None),
    ("durable_4k_1", "create+4K write+fsync+close files/s", "higher",
     "R1>=1xbindfs; R3>=0.7xbindfs",
     [ge("durable_4k_1", R1, BF, 1.0), ge("durable_4k_1", R3, BF, 0.7)], None),
    ("durable_4k_4", "the same, 4 processes, files/s", "higher", ">=1.8x own 1 process",
     [durable_scales], None),
    ("create_4k", "create+4K write+close files/s", "higher",
     "R1>=0.8xfc,>=1.2xbindfs; R3>=1xbindfs",
     [ge("create_4k", R1, FC, 0.8), ge("create_4k", R1, BF, 1.2), ge("create_4k", R3, BF, 1.0)], None),
    ("fsync_p50", "4K append+fsync p50 us", "lower", "R3<=1.3xnative",
     [le("fsync_p50", R3, NAT, 1.3)], None),
    ("fsync_p99", "4K append+fsync p99 us", "lower", "-", [], None),
    ("open_w", "open(O_WRONLY)+close us", "lower", "-", [], None),
    ("open_r", "open(O_RDONLY)+close us", "lower", "-", [], None),
    ("open_ratio", "open write/read ratio", "lower", "<=1.2",
     [le("open_ratio", R1, None, 1.2), le("open_ratio", R3, None, 1.2)], None),
    ("tar_x", f"tar x {tree_files:,} files, files/s", "higher", "R1>=1xbindfs",
     [ge("tar_x", R1, BF, 1.0)], None),
    ("rm_rf", f"rm -rf {tree_files:,} files, files/s", "higher", "R1>=1xbindfs",
     [ge("rm_rf", R1, BF, 1.0)], None),
    ("ls_l", f"ls -l {nentries:,} entries, cold s", "lower", "<=2xbindfs",
     [le("ls_l", R1, BF, 2.0), le("ls_l", R3, BF, 2.0)], None),
    ("writers_many", f"{many:,} concurrent writers x 1 MiB MB/s", "higher", "-", [], None),
    ("writers_few", f"{few} concurrent writers x 1 MiB MB/s", "higher", "-", [], None),
    ("writers_ratio", f"{many:,}/{few} concurrent writers ratio", "higher", ">=0.8",
     [ge("writers_ratio", R1, None, 0.8), ge("writers_ratio", R3, None, 0.8)], None),
    ("lease_renew_1000000", "lease renew/s, 10^6 leases [1]", "higher", ">=1000000",
     [ge("lease_renew_1000000", "lease", None, 1e6)], ("lease", R1)),
    ("lease_tick_1000", "lease idle tick ns, 10^3 leases [1]", "lower", "-", [], ("lease", R1)),
    ("lease_tick_1000000", "lease idle tick ns, 10^6 leases [1]", "lower", "<=2x the 10^3 tick",
     [tick_flat], ("lease", R1)),
    ("lease_bytes_1000000", "lease bytes/lease, 10^6 leases [1]", "lower", "<=256",
     [le("lease_bytes_1000000", "lease", None, 256)], ("lease", R1)),
    ("mem_peak", f"daemon RSS peak KiB, {nwriters} writers [2]", "lower",
     "bounded: <=" + (f"{bound:.0f}" if bound is not None else "bound"),
     [mem_bounded], (R3, R3)),
]
# Rows of the mount figures not asked for (--rows) are left out.
group_of = {"seq_write": "seq", "seq_read_cold": "seq", "seq_read_warm": "seq", "seq_read_daemon": "seq", "seq_read_touched": "seq",
            "seq_read_again": "seq", "seq_read_again_daemon": "seq", "durable_4k_1": "create", "durable_4k_4": "create",
            "create_4k": "create", "fsync_p50": "fsync", "fsync_p99": "fsync",
            "open_w": "open", "open_r": "open", "open_ratio": "open",
            "tar_x": "tree", "rm_rf": "tree", "ls_l": "ls",
            "writers_few": "writers", "writers_many": "writers", "writers_ratio": "writers"}
rows = [r for r in rows if group_of.get(r[0], "") in groups or r[0] not in group_of]
cols = [(NAT, "native"), (FC, "fuse-ceil"), (BF, "bindfs"), (R1, "lfs R=1"), (R3, "lfs R=3")]
B1, B3 = "before-r1", "before-r3"
# An older build measured beside this one (LEASEFS_BEFORE_BIN): its columns
# and this build's ratio to it.
before = any(k[1] in (B1, B3) for k in vals)
if before:
    cols += [(B1, "before R=1"), (B3, "before R=3")]
pairs = ([(R1, NAT), (R1, FC), (R3, NAT), (R3, FC), (R1, BF), (R3, BF)]
         + ([(R1, B1), (R3, B3)] if before else []))

def fmt(x):
    if x is None:
        return "n/a"
    return f"{x:.2f}" if abs(x) < 10 else f"{x:.0f}"

def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b

short = {NAT: "nat", FC: "fc", BF: "bf", B1: "before", B3: "before"}
head = (["figure", "better"] + [c[1] for c in cols]
        + [f"{'R1' if a == R1 else 'R3'}/{short[b]}" for a, b in pairs] + ["goal", "met"])
lines = []
for key, name, better, goal, checks, shown in rows:
    if shown is None:
        m = {t: med.get((key, t)) for t, _ in cols}
    else:
        src, col = shown
        m = {t: (med.get((key, src)) if t == col else None) for t, _ in cols}
    line = [name, better] + [fmt(m[t]) if shown is None or t == shown[1] else "-" for t, _ in cols]
    for lt, base in pairs:
        r = ratio(m[lt], m[base])
        line.append("n/a" if r is None else f"{r:.2f}")
    res = [c() for c in checks]
    known = [r for r in res if r is not None]
    met = "-" if not checks else "n/a" if not known else "yes" if all(known) else "NO"
    if known and len(known) < len(res) and met == "yes":
        met = "yes*"
    lines.append(line + [goal, met])
w = [max(len(str(r[i])) for r in [head] + lines) for i in range(len(head))]
def show(r):
    return "  ".join(str(c).ljust(w[i]) if i < 2 or i >= len(head) - 2 else str(c).rjust(w[i]) for i, c in enumerate(r))
print()
print(show(head))
print("  ".join("-" * x for x in w))
for l in lines:
    print(show(l))
n = max((len(v) for k, v in vals.items() if k[1] in dict(cols)), default=0)
print()
print(f"medians of up to {n} run(s); ratios are leasefs / column "
      "(for 'higher' rows > 1 is faster, for 'lower' rows < 1 is faster)")
print("met: yes/NO against the goal, yes* = met where measured (some columns n/a), n/a = not measured")
if groups & {"tree", "ls", "writers"}:
    print("tar x, rm -rf: files per second of the tree's files; ls -l: seconds, FUSE targets remounted "
          "first; writers: the same files of 1 MiB, one writer process each, few or many at a time; "
          "fuse-ceiling has no directories: its tar, rm, ls are n/a (benches/README.md)")
print("[1] the lease manager alone (benches/lease_bench.rs), no mount, one run")
print("[2] benches/writers_memory.sh: leasefs R=3, each writer appends 1 MiB writes; "
      "bound = idle RSS + N x (81 x 64 KiB packets + 1 MiB request); one run")
PY
if [[ -s $notes ]]; then
    echo
    echo "notes:"
    sed 's/^/  /' "$notes"
fi
echo
echo "raw figures, fio JSON and logs: $out"
exit 0
