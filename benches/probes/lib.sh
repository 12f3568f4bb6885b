# Sourced by the probes that mount leasefs builds side by side. The
# caller sets `work` (its scratch directory) and `mounts` (an array its
# cleanup unmounts); mount_leasefs NAME BIN R mounts BIN at
# $work/NAME/mnt with R datanodes (R replicas), and waits for the mount.

mount_leasefs() { # NAME BIN R
    local base=$work/$1 i args
    mkdir -p "$base/mnt" "$base/data"
    args=(mount "$base/mnt" --data "$base/data")
    for ((i = 1; i <= $3; i++)); do
        mkdir -p "$base/dn$i"
        args+=(--datanode "$base/dn$i")
    done
    timeout 60 "$2" "${args[@]}" --replication "$3" >"$base/log" 2>&1 || {
        echo "cannot mount $1: $(head -c 500 "$base/log")" >&2
        exit 1
    }
    for ((i = 0; i < 100; i++)); do
        findmnt -n "$base/mnt" >/dev/null && break
        sleep 0.1
    done
    mounts+=("$base/mnt")
}
