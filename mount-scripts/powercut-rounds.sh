#!/usr/bin/env bash
# powercut-rounds.sh — the long power-cut run: 500 rounds (CI runs 50 of
# them as tests/powercut_rounds.rs). Builds leasefs and the powercut tools,
# then runs tools/powercut's powercut-rounds and prints its report; the
# last line gives the totals (rounds per workload, rounds that failed).
#
#   mount-scripts/powercut-rounds.sh [--rounds N] [--seed S] [--keep-going] [--fs plain|ext4|xfs]
#
# --fs ext4 or xfs puts the data directory and each datanode on a disk of
# that filesystem (a loop device over the powercut mount): the paths users
# run (ranged syncs, zero fill, one-step small files). Default: plain.
#
# Needs root and /dev/fuse. A failed run keeps its work directory (logs,
# acknowledgement files, the powercut disk) under /var/tmp and names it.
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root" || exit 1
rounds=500
extra=()
while [[ $# -gt 0 ]]; do
    case $1 in
        --rounds) rounds=${2:?--rounds needs a number}; shift 2 ;;
        --seed) extra+=(--seed "${2:?--seed needs a number}"); shift 2 ;;
        --keep-going) extra+=(--keep-going); shift ;;
        --fs) extra+=(--fs "${2:?--fs needs plain, ext4 or xfs}"); shift 2 ;;
        -h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) echo "powercut-rounds.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
done
cargo build --release && cargo build --release -p powercut || exit 1
exec target/release/powercut-rounds run --rounds "$rounds" \
    --leasefs "${LEASEFS_BIN:-$root/target/release/leasefs}" "${extra[@]}"
