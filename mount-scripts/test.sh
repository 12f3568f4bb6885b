#!/usr/bin/env bash
# test.sh — the project's test command (README; .ci/run calls it).
#
#   mount-scripts/test.sh [--no-pjdfstest] [--no-etcd] [--bench] [-- CARGO_TEST_ARGS...]
#
# 0. tools/modcycles.py           fails on a dependency cycle between modules
#                                  of the crate (`use` items and inline paths);
#    mount-scripts/fuse-uring.sh   FUSE over io_uring enabled where the kernel
#                                  has it (as root), so the suites run on it
# 1. cargo test --release --no-run (leasefs and every test, built once), and
#    the test tools (`cargo build --release -p powercut -p testkit`:
#    tools/powercut, the power-cut filesystem; tools/testkit, the processes
#    the tests drive)
# 2. cargo test --release          unit + integration tests; the integration
#                                  tests find the binary through LEASEFS_BIN
# 2b. the same suites again on the etcd backend (LEASEFS_TEST_META=etcd: every
#     mount keeps its namespace and leases in an etcd the tests start on
#     loopback); the multi-daemon, etcd conformance and cluster lease tests
#     already ran in step 2
# 2b'. tests/power_cut.rs again on ext4 and on XFS disks (LEASEFS_TEST_POWERCUT_FS)
# 2c. where step 2 ran over FUSE io_uring rings, the request-path suites again
#     through /dev/fuse (LEASEFS_TEST_FUSE_URING=off)
# 3. tests/pjdfstest.sh            POSIX suite against a real mount; passes when
#                                  every failure is in tests/pjdfstest-expected-failures.txt
# 4. with --bench: benches/run.sh --quick, report only: never fails the run
#    (about 6 minutes; off by default so that the tests stay within CI's
#    30 minutes; the benchmark proper is benches/run.sh)
#
# Real mounts need /dev/fuse and, for pjdfstest's privileged cases, root.
# Environment: LEASEFS_BIN (exported; default target/release/leasefs),
# CARGO_TEST_TIMEOUT (seconds, default 1200), and those of tests/pjdfstest.sh.
# Exit status: 0 when the cycle check, build, cargo test and pjdfstest all
# passed, 1 otherwise.
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root" || exit 1

run_pjdfstest=1
run_bench=0
run_etcd=1
cargo_test_args=()
while [[ $# -gt 0 ]]; do
    case $1 in
        --no-pjdfstest) run_pjdfstest=0; shift ;;
        --bench) run_bench=1; shift ;;
        --no-bench) run_bench=0; shift ;;
        --no-etcd) run_etcd=0; shift ;;
        --) shift; cargo_test_args=("$@"); break ;;
        -h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) echo "test.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
done

# A rustup toolchain that is not on PATH yet (fresh shell after setup.sh).
if ! command -v cargo >/dev/null 2>&1 && [[ -x ${CARGO_HOME:-$HOME/.cargo}/bin/cargo ]]; then
    export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
fi

section() { printf '\n=== %s ===\n' "$*"; }

declare -A status=()
started=$SECONDS

section "module dependency cycles"
if python3 "$root/tools/modcycles.py" "$root/src"; then
    status[modcycles]=ok
else
    status[modcycles]=FAILED
fi

section "FUSE over io_uring"
"$root/mount-scripts/fuse-uring.sh" || echo "test.sh: warning: FUSE over io_uring could not be enabled" >&2
uring_on=0
[[ $(cat /sys/module/fuse/parameters/enable_uring 2>/dev/null) == Y ]] && uring_on=1

section "build: cargo test --release --no-run, and the test tools"
# The tests' build, which includes leasefs itself (target/release/leasefs),
# then the tools. Not `cargo build` first: `cargo test` resolves the
# dependencies' features together with the dev-dependencies, so a plain
# build compiled leasefs and a dozen of its dependencies once more for the
# tests (3 of CI's 30 minutes on 2 cores), and that second build counted
# against the tests' time limit below, which now only runs them.
if ! cargo test --release --no-run || ! cargo build --release -p powercut -p testkit; then
    echo "test.sh: build failed" >&2
    exit 1
fi
export LEASEFS_BIN=${LEASEFS_BIN:-$root/target/release/leasefs}

[[ -e /dev/fuse ]] || echo "test.sh: warning: /dev/fuse is missing: mounting tests will fail" >&2

section "cargo test --release --no-fail-fast"
# The minute of every hostile attack at once runs 20 s here (about 35 s).
export LEASEFS_HOSTILE_SECS=${LEASEFS_HOSTILE_SECS:-20}
# A hung mount must not hang CI: the whole cargo test gets a time limit.
timeout --kill-after=30 "${CARGO_TEST_TIMEOUT:-1200}" \
    cargo test --release --no-fail-fast "${cargo_test_args[@]}"
rc_test=$?
if [[ $rc_test -eq 0 ]]; then
    status[cargo-test]=ok
elif [[ $rc_test -eq 124 || $rc_test -eq 137 ]]; then
    status[cargo-test]=FAILED
    echo "test.sh: cargo test timed out after ${CARGO_TEST_TIMEOUT:-1200}s" >&2
else
    status[cargo-test]=FAILED
fi

# Runs the named suites once more with VAR=VALUE in their environment and
# records the outcome under STATUS.
run_suites() { # STATUS VAR=VALUE SUITE...
    local key=$1 setting=$2 t
    shift 2
    local args=()
    for t in "$@"; do args+=(--test "$t"); done
    if env "$setting" timeout --kill-after=30 "${CARGO_TEST_TIMEOUT:-1200}" \
        cargo test --release --no-fail-fast "${args[@]}"; then
        status[$key]=ok
    else
        status[$key]=FAILED
    fi
}

# The suites that mount through the common fixture, minus the 50 crash
# rounds (SQLite recovery at mount; too long to run twice).
etcd_suites=(foundation tools mount_cli smoke lease_open lease_wait lease_expiry lease_state
    elect spout spout_delivery housekeeping faults_pipeline faults_read faults_repair faults_heartbeat
    faults_fsck datanode_identity datanode_admin)
if [[ $run_etcd -eq 1 && ${#cargo_test_args[@]} -eq 0 ]]; then
    section "the same suites on the etcd backend"
    run_suites cargo-test-etcd LEASEFS_TEST_META=etcd "${etcd_suites[@]}"
fi

# The per-rule power-cut tests again with the data directory and the
# datanodes on ext4 and on XFS disks (loop devices over the powercut
# mount): the ranged syncs, zero fill and one-step small files users run.
for fs in ext4 xfs; do
    if [[ ${#cargo_test_args[@]} -eq 0 ]]; then
        section "power-cut tests on $fs disks"
        run_suites "power-cut-$fs" LEASEFS_TEST_POWERCUT_FS=$fs power_cut
    fi
done

# The suites that exercise every kind of request and reply, through
# /dev/fuse as well when step 2 used the rings.
dev_suites=(foundation lease_open lease_wait page_cache requests permissions replica_sync
    faults_pipeline stats dir_listing)
if [[ $uring_on -eq 1 && ${#cargo_test_args[@]} -eq 0 ]]; then
    section "request-path suites through /dev/fuse"
    run_suites cargo-test-dev-fuse LEASEFS_TEST_FUSE_URING=off "${dev_suites[@]}"
fi

if [[ $run_pjdfstest -eq 1 ]]; then
    section "pjdfstest"
    if "$root/tests/pjdfstest.sh"; then
        status[pjdfstest]=ok
    else
        status[pjdfstest]=FAILED
    fi
fi

if [[ $run_bench -eq 1 ]]; then
    section "benchmark (quick, report only)"
    if timeout --kill-after=30 600 "$root/benches/run.sh" --quick; then
        status[bench]="ran (report only)"
    else
        status[bench]="did not complete (report only, ignored)"
    fi
fi

section "summary ($((SECONDS - started)) s)"
rc=0
for step in modcycles cargo-test cargo-test-etcd power-cut-ext4 power-cut-xfs cargo-test-dev-fuse pjdfstest bench; do
    [[ -n ${status[$step]:-} ]] || continue
    printf '%-20s %s\n' "$step" "${status[$step]}"
    [[ ${status[$step]} != FAILED ]] || rc=1
done
exit $rc
