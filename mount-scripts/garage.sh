#!/usr/bin/env bash
# garage.sh — a real S3-compatible object store for the tests: three Garage
# nodes on loopback with replication factor 3, one bucket and one key.
#
#   mount-scripts/garage.sh install          # cargo install garage 2.5.0 if missing
#   mount-scripts/garage.sh path             # print garage's path; exit 1 if missing
#   mount-scripts/garage.sh up DIR           # start the cluster, write DIR/env
#   mount-scripts/garage.sh down DIR [--purge]
#
# `up DIR` gives each node its own config, metadata and data directory under
# DIR/node0..2, one rpc_secret generated at the first `up` (kept in the
# configs, mode 0600), one zone per node and 1G of capacity each, then applies
# the layout, creates the bucket ($GARAGE_BUCKET, default leasefs) and a key
# allowed to read and write it, and waits until an S3 PUT and GET through
# curl --aws-sigv4 succeed. It writes DIR/env (mode 0600, shell syntax):
#   AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY AWS_REGION S3_ENDPOINT S3_BUCKET
#   S3_ENDPOINT_0..2 (each node's S3 API) GARAGE_PID_0..2 GARAGE_PIDS
# Ports: node i uses BASE+10i (S3), BASE+10i+1 (RPC), BASE+10i+3 (admin),
# BASE = $GARAGE_BASE_PORT (default 39000); a port already taken is an error.
# Running `up` again on the same DIR restarts only the nodes that are not
# running and repeats nothing already done (layout, bucket, key).
#
# `down DIR` stops the nodes this script started there: the pids recorded in
# DIR, and only while /proc says that pid still runs garage with DIR's config.
# TERM, then KILL after 10 s. --purge kills at once (KILL) and removes what
# `up` made in DIR.
#
# Needs only bash, coreutils, grep, sed, setsid (util-linux: all essential on
# Debian) and curl (>= 7.75 for --aws-sigv4; Debian 12 has 7.88), plus garage
# itself (`install` builds it with cargo: ~8 min on 2 cores). GARAGE_BIN picks
# the binary; else PATH, then ~/.cargo/bin. Runs as root or as any user.
set -euo pipefail

GARAGE_VERSION=2.5.0
WAIT_SECS=${GARAGE_WAIT_SECS:-90}
REGION=garage
NODES=(0 1 2)

die() { echo "garage.sh: $*" >&2; exit 1; }
say() { echo "garage.sh: $*" >&2; }

usage() {
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
}

find_garage() {
    if [[ -n ${GARAGE_BIN:-} ]]; then
        [[ -x $GARAGE_BIN ]] || die "GARAGE_BIN=$GARAGE_BIN is not an executable"
        echo "$GARAGE_BIN"; return 0
    fi
    local g
    g=$(command -v garage 2>/dev/null) && { echo "$g"; return 0; }
    for g in "${CARGO_HOME:-$HOME/.cargo}/bin/garage" /root/.cargo/bin/garage /usr/local/bin/garage; do
        [[ -x $g ]] && { echo "$g"; return 0; }
    done
    return 1
}

cmd_install() {
    local g
    if g=$(find_garage); then
        echo "garage is installed: $g ($("$g" --version 2>/dev/null | head -1))"
        return 0
    fi
    command -v cargo >/dev/null || die "cargo is missing: install Rust first (mount-scripts/setup.sh --rustup)"
    say "building garage $GARAGE_VERSION with cargo (about 8 minutes on 2 cores)"
    local t0=$SECONDS
    cargo install garage --version "$GARAGE_VERSION" --locked
    g=$(find_garage) || die "cargo install finished but no garage binary was found"
    echo "garage is installed: $g (built in $((SECONDS - t0)) s)"
}

# --- helpers for up/down -----------------------------------------------------

check_base() {
    local base=${GARAGE_BASE_PORT:-39000}
    [[ $base =~ ^[0-9]+$ && $base -ge 1024 && $base -le 65500 ]] ||
        die "GARAGE_BASE_PORT=$base is not a port between 1024 and 65500"
}

port_of() { # node kind -> port (the base is checked by check_base first)
    local base=${GARAGE_BASE_PORT:-39000}
    case $2 in s3) echo $((base + 10 * $1)) ;; rpc) echo $((base + 10 * $1 + 1)) ;;
        admin) echo $((base + 10 * $1 + 3)) ;; esac
}

port_taken() { # true when something accepts connections on 127.0.0.1:$1
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

hex32() { od -An -vtx1 -N32 /dev/urandom | tr -d ' \n'; }

conf() { echo "$DIR/node$1/garage.toml"; }

g() { # node args... : the garage CLI against one node, never hanging
    local n=$1; shift
    timeout 30 "$GARAGE" -c "$(conf "$n")" "$@"
}

# The pid recorded for node $1 when it is still our garage, else nothing.
live_pid() {
    local f="$DIR/node$1/pid" pid
    [[ -f $f ]] || return 0
    pid=$(<"$f")
    [[ $pid =~ ^[0-9]+$ ]] || return 0
    [[ -r /proc/$pid/cmdline ]] || return 0
    # Guard against a recycled pid: it must be garage serving this config.
    if tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$(conf "$1") server"; then
        echo "$pid"
    fi
}

# wait_until SECS WHAT CMD... : retries CMD every 0.5 s, dies after SECS.
wait_until() {
    local secs=$1 what=$2; shift 2
    local deadline=$((SECONDS + secs))
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || die "timed out after ${secs} s waiting for $what (logs: $DIR/node*/garage.log)"
        sleep 0.5
    done
}

write_conf() { # node secret admin_token
    local n=$1 d="$DIR/node$1"
    mkdir -p "$d/meta" "$d/data"
    (
        umask 077
        cat >"$d/garage.toml.tmp" <<EOF
# Written by mount-scripts/garage.sh up; node $n of 3.
metadata_dir = "$d/meta"
data_dir = "$d/data"
db_engine = "lmdb"
replication_factor = 3
metadata_fsync = false
data_fsync = false
rpc_bind_addr = "127.0.0.1:$(port_of "$n" rpc)"
rpc_public_addr = "127.0.0.1:$(port_of "$n" rpc)"
rpc_secret = "$2"

[s3_api]
s3_region = "$REGION"
api_bind_addr = "127.0.0.1:$(port_of "$n" s3)"
root_domain = ".s3.garage.localhost"

[admin]
api_bind_addr = "127.0.0.1:$(port_of "$n" admin)"
admin_token = "$3"
EOF
        mv "$d/garage.toml.tmp" "$d/garage.toml"
    )
}

check_ports() { # node: dies when one of its ports is taken
    local p
    for p in s3 rpc admin; do
        ! port_taken "$(port_of "$1" $p)" ||
            die "port $(port_of "$1" $p) (node $1 $p) is taken: set GARAGE_BASE_PORT to another base"
    done
}

STARTED=()
# On a failed `up`, stop the nodes this very run started (by their pids),
# so that a failure leaves nothing running that was not running before.
stop_started_on_failure() {
    local rc=$? n pid
    ((rc != 0)) || return 0
    for n in "${STARTED[@]}"; do
        pid=$(live_pid "$n")
        [[ -z $pid ]] || { kill -KILL "$pid" 2>/dev/null || true; say "stopped node $n (pid $pid) after the failure"; }
    done
}

start_node() {
    local n=$1 d="$DIR/node$1"
    # Own session, no terminal, output to a log: the node outlives this
    # script and never holds its caller's pipes open.
    setsid "$GARAGE" -c "$(conf "$n")" server </dev/null >>"$d/garage.log" 2>&1 &
    echo $! >"$d/pid"
    disown
    STARTED+=("$n")
}

node_id() { g "$1" node id -q 2>/dev/null | head -1; }

s3_curl() { # method url [curl args...]
    local m=$1 url=$2; shift 2
    curl -sS --fail --max-time 20 -X "$m" \
        --aws-sigv4 "aws:amz:$REGION:s3" --user "$KEY_ID:$SECRET" \
        -H "x-amz-content-sha256: UNSIGNED-PAYLOAD" "$@" "$url"
}

s3_roundtrip() { # endpoint: PUT then GET a probe object, compare
    local probe="probe-$$-$RANDOM" body
    body="garage.sh probe $(date +%s%N)"
    s3_curl PUT "$1/$BUCKET/.garage-sh/$probe" --data-binary "$body" -o /dev/null || return 1
    [[ $(s3_curl GET "$1/$BUCKET/.garage-sh/$probe") == "$body" ]] || return 1
    s3_curl DELETE "$1/$BUCKET/.garage-sh/$probe" -o /dev/null || return 1
}

layout_version() { g 0 layout show 2>/dev/null | sed -n 's/.*[Cc]urrent cluster layout version: *\([0-9]*\).*/\1/p' | head -1; }

# Every node sees all three connected and every partition fully healthy.
# Checked on each node: Garage's peer discovery is gossip, so node 0 seeing
# everyone does not mean nodes 1 and 2 see each other (and with node 0 gone
# they would then have no quorum).
healthy() {
    local n h
    for n in "${NODES[@]}"; do
        h=$(g "$n" health 2>/dev/null) || return 1
        grep -q 'Cluster health: *HEALTHY' <<<"$h" || return 1
        grep -q 'Connected nodes: *3$' <<<"$h" || return 1
    done
}

cmd_up() {
    local t0 n secret token ids=() v
    t0=$(date +%s%N)
    check_base
    command -v curl >/dev/null || die "curl is missing (apt-get install curl)"
    GARAGE=$(find_garage) || die "garage is not installed: run mount-scripts/garage.sh install"
    BUCKET=${GARAGE_BUCKET:-leasefs}
    mkdir -p "$DIR"
    DIR=$(cd "$DIR" && pwd)

    # Configuration: made once; a second `up` reuses it (same secret, ports).
    if [[ -f $DIR/node0/garage.toml ]]; then
        secret=$(sed -n 's/^rpc_secret = "\(.*\)"$/\1/p' "$DIR/node0/garage.toml")
        token=$(sed -n 's/^admin_token = "\(.*\)"$/\1/p' "$DIR/node0/garage.toml")
        [[ -n $secret && -n $token ]] || die "$DIR/node0/garage.toml has no rpc_secret/admin_token: remove $DIR or use another DIR"
    else
        secret=$(hex32); token=$(hex32)
    fi
    for n in "${NODES[@]}"; do
        [[ -f $(conf "$n") ]] || write_conf "$n" "$secret" "$token"
    done

    local todo=()
    for n in "${NODES[@]}"; do
        if [[ -n $(live_pid "$n") ]]; then
            say "node $n already running (pid $(live_pid "$n"))"
        else
            check_ports "$n"
            todo+=("$n")
        fi
    done
    trap stop_started_on_failure EXIT
    for n in "${todo[@]}"; do start_node "$n"; done
    for n in "${NODES[@]}"; do
        wait_until "$WAIT_SECS" "node $n to answer on RPC port $(port_of "$n" rpc)" node_id "$n"
        [[ -n $(live_pid "$n") ]] || die "node $n exited: $(tail -3 "$DIR/node$n/garage.log" | tr '\n' ' ')"
        ids+=("$(node_id "$n")")
    done

    # Every pair connected at once (idempotent: already connected is fine);
    # gossip would link nodes 1 and 2 only later.
    local a b
    for a in 0 1; do
        for b in "${NODES[@]}"; do
            ((b > a)) || continue
            wait_until "$WAIT_SECS" "node $a to connect to node $b" g "$a" node connect "${ids[$b]}"
        done
    done

    # Layout: assign and apply once, when no version has been applied yet.
    v=$(layout_version)
    [[ -n $v ]] || die "cannot read the cluster layout version from 'garage layout show'"
    if [[ $v -eq 0 ]]; then
        for n in "${NODES[@]}"; do
            g 0 layout assign -z "dc$n" -c 1G "${ids[$n]%@*}" >/dev/null ||
                die "garage layout assign failed for node $n"
        done
        g 0 layout apply --version 1 >/dev/null || die "garage layout apply failed"
    fi
    wait_until "$WAIT_SECS" "every node to report the cluster HEALTHY with 3 nodes connected (garage health)" healthy

    # Bucket and key, each only when missing.
    g 0 bucket info "$BUCKET" >/dev/null 2>&1 || g 0 bucket create "$BUCKET" >/dev/null ||
        die "garage bucket create $BUCKET failed"
    local kname="$BUCKET-test-key"
    g 0 key info "$kname" >/dev/null 2>&1 || g 0 key create "$kname" >/dev/null ||
        die "garage key create $kname failed"
    g 0 bucket allow --read --write --owner "$BUCKET" --key "$kname" >/dev/null ||
        die "garage bucket allow failed"
    KEY_ID=$(g 0 key info --key-id "$kname" | tr -d '[:space:]')
    SECRET=$(g 0 key info --secret-key "$kname" | tr -d '[:space:]')
    [[ $KEY_ID =~ ^GK[0-9a-f]+$ && $SECRET =~ ^[0-9a-f]+$ ]] ||
        die "could not read the access key of $kname (got '$KEY_ID')"

    # The store serves S3 when a PUT and a GET succeed on every node.
    for n in "${NODES[@]}"; do
        wait_until "$WAIT_SECS" "an S3 PUT/GET on node $n (port $(port_of "$n" s3))" \
            s3_roundtrip "http://127.0.0.1:$(port_of "$n" s3)"
    done

    local pids=() tmp="$DIR/env.tmp"
    for n in "${NODES[@]}"; do pids+=("$(live_pid "$n")"); done
    (
        umask 077
        {
            echo "# Written by mount-scripts/garage.sh up $(date -u +%FT%TZ)"
            echo "AWS_ACCESS_KEY_ID=$KEY_ID"
            echo "AWS_SECRET_ACCESS_KEY=$SECRET"
            echo "AWS_REGION=$REGION"
            echo "S3_ENDPOINT=http://127.0.0.1:$(port_of 0 s3)"
            echo "S3_BUCKET=$BUCKET"
            for n in "${NODES[@]}"; do
                echo "S3_ENDPOINT_$n=http://127.0.0.1:$(port_of "$n" s3)"
                echo "GARAGE_PID_$n=${pids[$n]}"
            done
            echo "GARAGE_PIDS=\"${pids[*]}\""
        } >"$tmp"
        chmod 600 "$tmp"
        mv "$tmp" "$DIR/env"
    )
    local ms=$((($(date +%s%N) - t0) / 1000000))
    echo "garage.sh: 3 nodes up in $((ms / 1000)).$(printf %03d $((ms % 1000))) s; S3 at http://127.0.0.1:$(port_of 0 s3), bucket $BUCKET; env in $DIR/env"
}

cmd_down() {
    local purge=$1 n p pid pids=() deadline
    [[ -d $DIR ]] || { say "$DIR does not exist: nothing to stop"; return 0; }
    DIR=$(cd "$DIR" && pwd)
    # --purge throws the data away, so KILL at once: a node whose peer is
    # gone may take 10 s to shut down gracefully. Otherwise TERM first.
    local sig=TERM
    [[ $purge -eq 0 ]] || sig=KILL
    for n in "${NODES[@]}"; do
        pid=$(live_pid "$n")
        if [[ -n $pid ]]; then
            kill -"$sig" "$pid" 2>/dev/null || true
            pids+=("$n:$pid")
        fi
    done
    deadline=$((SECONDS + 10))
    for p in "${pids[@]}"; do
        n=${p%%:*}; pid=${p#*:}
        while [[ -n $(live_pid "$n") ]] && ((SECONDS < deadline)); do sleep 0.2; done
        if [[ -n $(live_pid "$n") ]]; then
            say "node $n (pid $pid) ignored TERM for 10 s: KILL"
            kill -KILL "$pid" 2>/dev/null || true
            local d2=$((SECONDS + 10))
            while [[ -n $(live_pid "$n") ]] && ((SECONDS < d2)); do sleep 0.2; done
            [[ -z $(live_pid "$n") ]] || die "node $n (pid $pid) is still running after KILL"
        fi
    done
    say "stopped ${#pids[@]} node(s) in $DIR"
    if [[ $purge -eq 1 ]]; then
        for n in "${NODES[@]}"; do rm -rf -- "$DIR/node$n"; done
        rm -f -- "$DIR/env" "$DIR/env.tmp"
        rmdir -- "$DIR" 2>/dev/null || true
        say "purged $DIR"
    fi
}

[[ $# -ge 1 ]] || usage
case $1 in
    install) [[ $# -eq 1 ]] || usage; cmd_install ;;
    path) [[ $# -eq 1 ]] || usage; find_garage || die "garage is not installed (mount-scripts/garage.sh install)" ;;
    up) [[ $# -eq 2 ]] || usage; DIR=$2; cmd_up ;;
    down)
        [[ $# -ge 2 && $# -le 3 ]] || usage
        DIR=$2; purge=0
        if [[ $# -eq 3 ]]; then [[ $3 == --purge ]] || usage; purge=1; fi
        cmd_down "$purge" ;;
    -h | --help | help) usage ;;
    *) usage ;;
esac
