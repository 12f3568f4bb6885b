#!/usr/bin/env bash
# benches/run.sh — leasefs against the native directory and the FUSE ceiling,
# measured in ONE run on the same disk (see benches/README.md).
#
#   benches/run.sh                # full: 1 GiB, 10,000 files, 2000 fsyncs, 3 runs
#   benches/run.sh --quick        # CI: 64 MiB, 1000 files, 200 fsyncs, 1 run
#   benches/run.sh --runs 5 --targets native,leasefs-r1
#   benches/run.sh --no-extra     # without the lease-manager and memory rows
#   LEASEFS_BEFORE_BIN=old/leasefs benches/run.sh --targets native,leasefs-r1,leasefs-r3,before-r1,before-r3
#                                 # a change's cost: an older build beside this one, in one run
#
# Targets: native, fuse-ceiling (../shared/tools/fuse-ceiling, `file` mode),
# bindfs (-o big_writes), leasefs-r1 (one datanode), leasefs-r3 (three datanodes),
# before-r1 and before-r3 (the same with the build LEASEFS_BEFORE_BIN names; the
# table then adds the columns and the ratios R1/before, R3/before).
# A target that cannot be set up or mounted shows n/a; the script carries on.
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
while [[ $# -gt 0 ]]; do
    case $1 in
        --runs) runs=${2:?--runs needs a number}; shift 2 ;;
        --runs=*) runs=${1#--runs=}; shift ;;
        --quick) quick=1; shift ;;
        --no-extra) extra=0; shift ;;
        --targets) targets_arg=${2:?--targets needs a list}; shift 2 ;;
        --targets=*) targets_arg=${1#--targets=}; shift ;;
        -h | --help) usage; exit 0 ;;
        *) echo "run.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
    esac
done
[[ -z $runs || $runs =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: --runs needs a positive number" >&2; exit 2; }

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(git -C "$here" rev-parse --show-toplevel 2>/dev/null || (cd "$here/.." && pwd))

if [[ $quick -eq 1 ]]; then
    runs=${runs:-1}
    seq_mib=64; nfiles=1000; nfsync=200; nopen=500
else
    runs=${runs:-3}
    seq_mib=1024; nfiles=10000; nfsync=2000; nopen=2000
fi
nwriters=100

IFS=, read -r -a targets <<<"$targets_arg"
for t in "${targets[@]}"; do
    case $t in
        native | fuse-ceiling | bindfs | leasefs-r1 | leasefs-r3 | before-r1 | before-r3) ;;
        *) echo "run.sh: unknown target '$t'" >&2; exit 2 ;;
    esac
done

for tool in fio python3 findmnt fusermount3; do
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
    note "cannot write /proc/sys/vm/drop_caches (not root): cold reads are n/a"
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
record() { # RUN TARGET FIGURE VALUE
    printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${4:-NA}" >>"$results"
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
        js=$out/fio/$t-run$run-readcold.json
        if fio_run "$js" --name=readcold --filename="$f" --rw=read --bs=1M --size="${seq_mib}M"; then
            record "$run" "$t" seq_read_cold "$(fio_json "$js" 'round(j["read"]["bw_bytes"] / 1e6, 1)')"
        else
            record "$run" "$t" seq_read_cold NA
        fi
    else
        record "$run" "$t" seq_read_cold NA
        is_mounted "$work/$t/mnt" || [[ $t == native ]] || return 1
    fi
    f=${tdir[$t]}/seq.dat
    js=$out/fio/$t-run$run-readwarm.json
    if fio_run "$js" --name=readwarm --filename="$f" --rw=read --bs=1M --size="${seq_mib}M"; then
        record "$run" "$t" seq_read_warm "$(fio_json "$js" 'round(j["read"]["bw_bytes"] / 1e6, 1)')"
    else
        record "$run" "$t" seq_read_warm NA
    fi
    rm -f "$f"
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

all_figures=(seq_write seq_read_cold seq_read_warm create_4k fsync_p50 fsync_p99 open_w open_r open_ratio)

run_target() { # RUN TARGET
    local run=$1 t=$2 fig
    if [[ -z ${usable[$t]:-} ]] || ! mount_target "$t" "$run"; then
        for fig in "${all_figures[@]}"; do record "$run" "$t" "$fig" NA; done
        # Not mountable now: not worth trying again in later runs.
        [[ -z ${usable[$t]:-} ]] || note "${label[$t]}: skipped in the remaining runs"
        unset 'usable[$t]'
        return
    fi
    log "run $run: ${label[$t]}"
    if fig_seq "$run" "$t" "${tdir[$t]}"; then
        fig_small_files "$run" "$t" "${tdir[$t]}"
        fig_fsync "$run" "$t" "${tdir[$t]}"
        fig_open "$run" "$t" "${tdir[$t]}"
    else
        note "${label[$t]}: lost its mount during the cold-read remount (run $run)"
        for fig in create_4k fsync_p50 fsync_p99 open_w open_r open_ratio; do record "$run" "$t" "$fig" NA; done
    fi
    unmount_target "$t"
    # The scratch data stays until the end (see fig_small_files).
}

# --- main ------------------------------------------------------------------------
fstype=$(findmnt -rn -T "$work" -o FSTYPE | tail -n1)
{
    echo "leasefs benchmark $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "host: $(uname -srm), $(nproc) CPUs, scratch $work ($fstype)"
    echo "leasefs: $bin${before_bin:+ (before: $before_bin)}"
    echo "mode: $([[ $quick -eq 1 ]] && echo quick || echo full), runs $runs, seq ${seq_mib} MiB, $nfiles files, $nfsync fsyncs, $nopen opens$([[ $extra -eq 1 ]] && echo ", lease manager, $nwriters writers' memory")"
} | tee "$out/header.txt" >&2
[[ $fstype != tmpfs ]] || note "warning: scratch directory is on tmpfs; set BENCH_DIR to a disk"

for t in "${targets[@]}"; do prepare_target "$t"; done

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

python3 - "$results" "$seq_mib" "$nwriters" <<'PY' | tee "$out/table.txt"
import csv, statistics, sys
path, seq_mib, nwriters = sys.argv[1], int(sys.argv[2]), sys.argv[3]
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

def tick_flat():
    a, b = med.get(("lease_tick_1000000", "lease")), med.get(("lease_tick_1000", "lease"))
    return None if a is None or b is None else a <= 2 * b

def mem_bounded():
    a, b = med.get(("mem_peak", R3)), med.get(("mem_bound", R3))
    return None if a is None or b is None else a <= b

bound = med.get(("mem_bound", R3))
# (figure, name, better, goal, checks, where the value shows)
rows = [
    ("seq_write", f"seq write {size} 1M+fsync MB/s", "higher",
     "R1>=0.9xfc,>=1.3xbindfs; R3>=0.3xfc",
     [ge("seq_write", R1, FC, 0.9), ge("seq_write", R1, BF, 1.3), ge("seq_write", R3, FC, 0.3)], None),
    ("seq_read_cold", "seq read cold MB/s", "higher", ">=0.9xfc",
     [ge("seq_read_cold", R1, FC, 0.9), ge("seq_read_cold", R3, FC, 0.9)], None),
    ("seq_read_warm", "seq read warm MB/s", "higher", ">=0.9xnative",
     [ge("seq_read_warm", R1, NAT, 0.9), ge("seq_read_warm", R3, NAT, 0.9)], None),
    ("create_4k", "create+4K write+close files/s", "higher",
     "R1>=0.8xfc,>=1.2xbindfs; R3>=1xbindfs",
     [ge("create_4k", R1, FC, 0.8), ge("create_4k", R1, BF, 1.2), ge("create_4k", R3, BF, 1.0)], None),
    ("fsync_p50", "4K append+fsync p50 us", "lower", "R3<=1.5xnative",
     [le("fsync_p50", R3, NAT, 1.5)], None),
    ("fsync_p99", "4K append+fsync p99 us", "lower", "-", [], None),
    ("open_w", "open(O_WRONLY)+close us", "lower", "-", [], None),
    ("open_r", "open(O_RDONLY)+close us", "lower", "-", [], None),
    ("open_ratio", "open write/read ratio", "lower", "<=1.2",
     [le("open_ratio", R1, None, 1.2), le("open_ratio", R3, None, 1.2)], None),
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
cols = [(NAT, "native"), (FC, "fuse-ceil"), (BF, "bindfs"), (R1, "lfs R=1"), (R3, "lfs R=3")]
B1, B3 = "before-r1", "before-r3"
# An older build measured beside this one (LEASEFS_BEFORE_BIN): its columns
# and this build's ratio to it.
before = any(k[1] in (B1, B3) for k in vals)
if before:
    cols += [(B1, "before R=1"), (B3, "before R=3")]
pairs = [(R1, NAT), (R1, FC), (R3, NAT), (R3, FC)] + ([(R1, B1), (R3, B3)] if before else [])

def fmt(x):
    if x is None:
        return "n/a"
    return f"{x:.2f}" if abs(x) < 10 else f"{x:.0f}"

def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b

short = {NAT: "nat", FC: "fc", B1: "before", B3: "before"}
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
