#!/usr/bin/env bash
# tests/pjdfstest.sh — run the POSIX suite pjdfstest (crates.io) against a fresh
# leasefs mount.
#
#   tests/pjdfstest.sh [TEST_PATTERN...]     # e.g. tests/pjdfstest.sh truncate::
#
# - installs pjdfstest with `cargo install pjdfstest --locked` when it is not on
#   PATH (nor in ~/.cargo/bin);
# - mounts leasefs ($LEASEFS_BIN, default target/release/leasefs) in the
#   foreground, in the background, on a temp dir with a fresh temp data dir
#   (its three default datanodes), daemon log kept;
# - mounts a small tmpfs as the secondary file system (-s);
# - runs pjdfstest -c CONFIG -p MNT -s SECONDARY, CONFIG being
#   ../shared/testing/pjdfstest.toml beside the clone, else tests/pjdfstest.toml;
# - writes the full output to target/pjdfstest/pjdfstest.log (and the daemon's
#   log to target/pjdfstest/leasefs.log), prints the summary and the failures;
# - always unmounts and removes its temp dirs.
#
# Exit status: 0 when every failing test is listed in
# tests/pjdfstest-expected-failures.txt, 1 otherwise (including: could not mount,
# pjdfstest crashed or timed out).
#
# Environment: LEASEFS_BIN, PJDFSTEST (binary), PJDFSTEST_CONFIG,
# PJDFSTEST_TIMEOUT (seconds for the whole suite, default 900),
# LEASEFS_MOUNT_OPTS (passed as `-o` to leasefs mount), RUST_LOG (daemon log
# level, default info).
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(git -C "$here" rev-parse --show-toplevel 2>/dev/null || (cd "$here/.." && pwd))

log() { printf 'pjdfstest.sh: %s\n' "$*" >&2; }

bin=${LEASEFS_BIN:-$root/target/release/leasefs}
if [[ ! -x $bin ]]; then
    log "no leasefs binary at $bin (run cargo build --release, or set LEASEFS_BIN)"
    exit 1
fi

# --- configuration -----------------------------------------------------------
config=${PJDFSTEST_CONFIG:-}
if [[ -z $config ]]; then
    if [[ -f $root/../shared/testing/pjdfstest.toml ]]; then
        config=$root/../shared/testing/pjdfstest.toml
    else
        config=$root/tests/pjdfstest.toml
    fi
fi
[[ -f $config ]] || { log "no pjdfstest configuration at $config"; exit 1; }
config=$(cd "$(dirname "$config")" && pwd)/$(basename "$config")
expected_file=$root/tests/pjdfstest-expected-failures.txt

# --- pjdfstest binary ----------------------------------------------------------
cargo_bin=${CARGO_HOME:-$HOME/.cargo}/bin
pjd=${PJDFSTEST:-}
if [[ -z $pjd ]]; then
    if command -v pjdfstest >/dev/null 2>&1; then
        pjd=$(command -v pjdfstest)
    elif [[ -x $cargo_bin/pjdfstest ]]; then
        pjd=$cargo_bin/pjdfstest
    else
        log "pjdfstest not found: cargo install pjdfstest --locked"
        if ! cargo install pjdfstest --locked; then
            log "cargo install pjdfstest failed"
            exit 1
        fi
        pjd=$cargo_bin/pjdfstest
    fi
fi
[[ -x $pjd ]] || { log "pjdfstest binary $pjd is not executable"; exit 1; }

[[ $EUID -eq 0 ]] || log "warning: not root: pjdfstest skips its privileged tests"

# --- temp dirs, mounts, cleanup ------------------------------------------------
outdir=$root/target/pjdfstest
mkdir -p "$outdir"
logfile=$outdir/pjdfstest.log
daemon_log=$outdir/leasefs.log

tmp=$(mktemp -d "${TMPDIR:-/tmp}/leasefs-pjdfstest.XXXXXX")
# pjdfstest switches to unprivileged users (dummy_auth), who must be able to
# reach the mount point: mktemp's 0700 would turn their tests into EACCES.
chmod 0755 "$tmp"
mnt=$tmp/mnt
data=$tmp/data
secondary=$tmp/secondary
mkdir -p "$mnt" "$data" "$secondary"
daemon_pid=
secondary_mounted=0

is_mounted() { findmnt -rn -M "$1" >/dev/null 2>&1; }

unmount_leasefs() {

    if is_mounted "$mnt"; then
        for _ in 1 2 3 4 5; do
            fusermount3 -u "$mnt" 2>/dev/null && break
            umount "$mnt" 2>/dev/null && break
            sleep 1
        done
        if is_mounted "$mnt"; then
            log "mount still busy after 5 s: lazy unmount"
            fusermount3 -u -z "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null
        fi
    fi
    if [[ -n $daemon_pid ]]; then
        # The daemon exits by itself once unmounted; give it time to flush.
        for _ in $(seq 1 100); do
            kill -0 "$daemon_pid" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$daemon_pid" 2>/dev/null; then
            log "leasefs (pid $daemon_pid) still running 10 s after unmount: SIGTERM"
            kill "$daemon_pid" 2>/dev/null
        fi
        wait "$daemon_pid" 2>/dev/null
        daemon_pid=
    fi
}

# shellcheck disable=SC2317  # called from the EXIT trap
cleanup() {
    unmount_leasefs
    if [[ $secondary_mounted -eq 1 ]]; then
        umount "$secondary" 2>/dev/null || umount -l "$secondary" 2>/dev/null
    fi
    [[ -f $tmp/leasefs.log ]] && cp "$tmp/leasefs.log" "$daemon_log"
    # Never delete through a mount that is still there.
    if ! is_mounted "$mnt" && ! is_mounted "$secondary"; then
        rm -rf --one-file-system "$tmp"
    else
        log "leaving $tmp in place: something is still mounted in it"
    fi
}
pjd_pid=
# shellcheck disable=SC2317  # signal handler
on_signal() {
    # Stop our own pjdfstest run at once (timeout passes the signal on).
    [[ -z $pjd_pid ]] || kill -TERM "$pjd_pid" 2>/dev/null
    exit "$1"
}
trap cleanup EXIT
trap 'on_signal 130' INT
trap 'on_signal 143' TERM

if mount -t tmpfs -o size=16m,mode=0755 leasefs-pjd-secondary "$secondary" 2>/dev/null; then
    secondary_mounted=1
else
    # Not root: any directory on another file system will do; /dev/shm is tmpfs.
    rmdir "$secondary"
    secondary=$(mktemp -d /dev/shm/leasefs-pjd-secondary.XXXXXX)
    log "could not mount a tmpfs; secondary dir is $secondary"
fi

# --- mount leasefs -------------------------------------------------------------
mount_args=(mount "$mnt" --data "$data" -f)
[[ -z ${LEASEFS_MOUNT_OPTS:-} ]] || mount_args+=(-o "$LEASEFS_MOUNT_OPTS")
log "mounting: $bin ${mount_args[*]}"
RUST_LOG=${RUST_LOG:-info} "$bin" "${mount_args[@]}" >"$tmp/leasefs.log" 2>&1 &
daemon_pid=$!
ready=0
for _ in $(seq 1 300); do
    if is_mounted "$mnt"; then ready=1; break; fi
    kill -0 "$daemon_pid" 2>/dev/null || break
    sleep 0.1
done
if [[ $ready -ne 1 ]]; then
    log "leasefs did not mount within 30 s; its output:"
    tail -n 20 "$tmp/leasefs.log" >&2
    exit 1
fi

# --- run -----------------------------------------------------------------------
log "running: $pjd -c $config -p $mnt -s $secondary $*"
log "full output: $logfile"
cd "$tmp" || exit 1
start=$SECONDS
# In the background + wait, so that a signal to this script is handled at once.
NO_COLOR=1 RUST_BACKTRACE=0 timeout --kill-after=30 "${PJDFSTEST_TIMEOUT:-900}" \
    "$pjd" -c "$config" -p "$mnt" -s "$secondary" "$@" >"$logfile" 2>&1 &
pjd_pid=$!
wait "$pjd_pid"
pjd_rc=$?
pjd_pid=
elapsed=$((SECONDS - start))
cd "$root" || exit 1
unmount_leasefs

# --- report --------------------------------------------------------------------
summary=$(grep -E '^Summary:' "$logfile" | tail -n1)
mapfile -t failed < <(awk 'NF >= 2 && ($NF == "FAILED" || ($(NF-1) == "PASSED" && $NF == "UNEXPECTEDLY")) { print $1 }' "$logfile")
mapfile -t passed < <(awk 'NF >= 2 && $NF == "ok" { print $1 }' "$logfile")
mapfile -t expected < <(sed -e 's/#.*//' -e 's/[[:space:]]//g' "$expected_file" 2>/dev/null | grep -v '^$')

declare -A is_expected=() did_pass=()
for t in "${expected[@]}"; do is_expected[$t]=1; done
for t in "${passed[@]}"; do did_pass[$t]=1; done

unexpected=()
for t in "${failed[@]}"; do
    [[ -n ${is_expected[$t]:-} ]] || unexpected+=("$t")
done

echo
echo "pjdfstest on leasefs (${elapsed}s, log $logfile)"
if [[ -n $summary ]]; then
    echo "$summary"
else
    echo "no summary line: pjdfstest did not finish (exit $pjd_rc); last lines:"
    tail -n 5 "$logfile"
fi
[[ $pjd_rc -ne 124 && $pjd_rc -ne 137 ]] || echo "pjdfstest timed out after ${PJDFSTEST_TIMEOUT:-900}s; the test after $(awk 'NF >= 2 && /^[^[:space:]]/ { n = $1 } END { print n }' "$logfile") hung"

reason_of() { # TEST: the message pjdfstest printed under the FAILED line
    awk -v t="$1" 'found { sub(/^\t/, ""); print; exit } $1 == t && $NF == "FAILED" { found = 1 }' "$logfile"
}
if [[ ${#unexpected[@]} -gt 0 ]]; then
    echo "UNEXPECTED failures (${#unexpected[@]}; not in tests/pjdfstest-expected-failures.txt):"
    for t in "${unexpected[@]}"; do
        reason=$(reason_of "$t")
        printf '  %s%s\n' "$t" "${reason:+  -- $reason}"
    done
fi
n_expected_failed=$((${#failed[@]} - ${#unexpected[@]}))
if [[ $n_expected_failed -gt 0 ]]; then
    echo "expected failures that failed ($n_expected_failed):"
    for t in "${failed[@]}"; do
        [[ -z ${is_expected[$t]:-} ]] || printf '  %s\n' "$t"
    done
fi
stale=()
for t in "${expected[@]}"; do
    [[ -z ${did_pass[$t]:-} ]] || stale+=("$t")
done
if [[ ${#stale[@]} -gt 0 ]]; then
    echo "listed as expected failures but passed (remove them from the list?):"
    printf '   %s\n' "${stale[@]}"
fi

if [[ -z $summary ]]; then
    echo "RESULT: FAIL (pjdfstest did not complete)"
    exit 1
fi
if [[ ${#unexpected[@]} -gt 0 ]]; then
    echo "RESULT: FAIL (${#unexpected[@]} unexpected failures)"
    exit 1
fi
echo "RESULT: OK (${#failed[@]} failures, all expected)"
exit 0
