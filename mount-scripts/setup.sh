#!/usr/bin/env bash
# setup.sh — get leasefs working on a fresh Debian machine. Idempotent: run it
# again at any time; it only does what is still missing.
#
#   mount-scripts/setup.sh --mount /mnt/leasefs     # packages, build, mount
#   mount-scripts/setup.sh --install                # also install system-wide
#
# Steps:
#  1. apt-get installs whatever of fuse3, attr, acl, rsync, fio, bindfs, sqlite3,
#     etcd-server, strace, libfaketime, e2fsprogs, xfsprogs and mount (tests: the
#     power cuts on ext4 and XFS loop disks), python3, gcc, libc6-dev is missing (no
#     protobuf: the build takes protoc from a crate, see build-support/protoc) (checked with dpkg -s; nothing is
#     fetched when everything is there). Uses sudo when not root.
#  2. Checks for a Rust toolchain new enough for the project (edition 2024,
#     Rust >= 1.85); Debian's own rustc is too old. If cargo is missing, it offers
#     rustup (--rustup installs it without asking).
#  3. cargo build --release (once; cargo skips it when nothing changed).
#  4. With --install: /usr/local/bin/leasefs, /sbin/mount.fuse.leasefs (the
#     helper mount(8) runs for `-t fuse.leasefs` and fstab), and the systemd
#     unit /etc/systemd/system/leasefs@.service. Nothing is installed otherwise.
#  5. Enables FUSE over io_uring in the kernel where it has it and we are
#     root (mount-scripts/fuse-uring.sh: the fuse module parameter
#     enable_uring; other FUSE filesystems are unaffected unless they ask
#     for it); --no-fuse-uring leaves the kernel as it is.
#  6. With --mount DIR: mounts leasefs on DIR with its embedded defaults (data
#     under $XDG_DATA_HOME/leasefs or ~/.local/share/leasefs, three datanodes).
#     Already mounted: says so and succeeds. A dead mount left by a crashed
#     daemon is cleared first.
#
# The mount does not use allow_other, so /etc/fuse.conf (user_allow_other) is
# never touched or needed; only the mounting user (and root) sees the files.
set -euo pipefail

usage() {
    cat <<'EOF'
usage: mount-scripts/setup.sh [--install] [--mount MOUNTPOINT] [--data DIR]
                              [-o key=value,...] [--no-packages] [--no-build] [--rustup]

  --mount DIR    mount leasefs on DIR (created if missing) with embedded defaults
  --data DIR     data directory for --mount (default: leasefs's own default)
  -o OPTS        leasefs -o options for --mount (e.g. soft_limit=30,lease_wait=5)
  --install      install binary, mount helper and systemd unit system-wide (root)
  --no-packages  do not check/install Debian packages
  --no-build     do not run cargo build (use the existing target/release/leasefs)
  --rustup       install Rust with rustup without asking if cargo is missing
  --no-fuse-uring  do not enable FUSE over io_uring in the kernel
  --garage       also build Garage (an S3-compatible store, for object-store
                 datanodes and their tests; about 8 minutes on 2 cores)
EOF
}

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mountpoint_arg=
data_arg=
mount_opts=
do_install=0
do_packages=1
do_build=1
do_rustup=0
do_uring=1
do_garage=0

while [[ $# -gt 0 ]]; do
    case $1 in
        --mount) mountpoint_arg=${2:?--mount needs a directory}; shift 2 ;;
        --mount=*) mountpoint_arg=${1#--mount=}; shift ;;
        --data) data_arg=${2:?--data needs a directory}; shift 2 ;;
        --data=*) data_arg=${1#--data=}; shift ;;
        -o) mount_opts=${2:?-o needs options}; shift 2 ;;
        --install) do_install=1; shift ;;
        --no-packages) do_packages=0; shift ;;
        --no-build) do_build=0; shift ;;
        --rustup) do_rustup=1; shift ;;
        --no-fuse-uring) do_uring=0; shift ;;
        --garage) do_garage=1; shift ;;
        -h | --help) usage; exit 0 ;;
        *)
            # A bare directory is taken as the mount point.
            if [[ -z $mountpoint_arg && $1 != -* ]]; then
                mountpoint_arg=$1; shift
            else
                echo "setup.sh: unknown argument '$1'" >&2; usage >&2; exit 2
            fi
            ;;
    esac
done

say() { printf '==> %s\n' "$*"; }
die() { printf 'setup.sh: %s\n' "$*" >&2; exit 1; }

as_root() {
    if [[ $EUID -eq 0 ]]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        die "need root for: $* (run as root or install sudo)"
    fi
}

# --- 1. Debian packages -------------------------------------------------------
packages=(fuse3 attr acl rsync fio bindfs sqlite3 python3 gcc libc6-dev etcd-server strace curl libfaketime e2fsprogs xfsprogs mount)

install_packages() {
    local missing=() p
    for p in "$@"; do
        dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
    done
    if [[ ${#missing[@]} -eq 0 ]]; then
        say "packages: all present"
        return
    fi
    command -v apt-get >/dev/null 2>&1 || die "missing packages (${missing[*]}) and no apt-get"
    say "packages: installing ${missing[*]}"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
}

if [[ $do_packages -eq 1 ]]; then
    if command -v dpkg >/dev/null 2>&1; then
        install_packages "${packages[@]}"
    else
        say "packages: not a Debian system, skipping (need: ${packages[*]})"
    fi
fi

# --- 2. Rust toolchain --------------------------------------------------------
min_rust=1.85

rust_ok() {
    command -v cargo >/dev/null 2>&1 || return 1
    local v
    v=$(cargo --version 2>/dev/null | awk '{print $2}')
    [[ -n $v ]] || return 1
    # version >= min_rust ?
    [[ $(printf '%s\n%s\n' "$min_rust" "${v%%-*}" | sort -V | head -n1) == "$min_rust" ]]
}

if [[ $do_build -eq 1 ]]; then
    # A rustup install from an earlier run may not be on PATH yet.
    if ! command -v cargo >/dev/null 2>&1 && [[ -x ${CARGO_HOME:-$HOME/.cargo}/bin/cargo ]]; then
        export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
    fi
    if ! command -v cargo >/dev/null 2>&1; then
        if [[ $do_rustup -eq 0 && -t 0 ]]; then
            read -r -p "cargo not found. Install Rust with rustup (https://rustup.rs) now? [Y/n] " answer || answer=n
            [[ -z $answer || $answer == [Yy]* ]] && do_rustup=1
        fi
        [[ $do_rustup -eq 1 ]] || die "cargo not found: install Rust >= $min_rust (https://rustup.rs, or rerun with --rustup)"
        install_packages curl ca-certificates
        say "rust: installing with rustup (minimal profile)"
        curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal
        export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
    fi
    rust_ok || die "$(cargo --version) is too old: leasefs needs Rust >= $min_rust (rustup update)"
    say "rust: $(cargo --version)"

# --- 3. Build -----------------------------------------------------------------
    say "build: cargo build --release"
    (cd "$root" && cargo build --release)
fi

if [[ $do_garage -eq 1 ]]; then
    "$root/mount-scripts/garage.sh" install
fi

bin=$root/target/release/leasefs
[[ -x $bin ]] || die "no binary at $bin (build failed or --no-build without a build)"

# --- 4. System-wide install (only with --install) ----------------------------
install_file() { # MODE SRC DEST
    local mode=$1 src=$2 dest=$3
    if [[ -f $dest ]] && cmp -s "$src" "$dest"; then
        say "install: $dest up to date"
    else
        as_root install -D -m "$mode" "$src" "$dest"
        say "install: $dest"
    fi
}

if [[ $do_install -eq 1 ]]; then
    install_file 0755 "$bin" /usr/local/bin/leasefs
    # libmount looks for /sbin/mount.<type> first, i.e. /sbin/mount.fuse.leasefs
    # for -t fuse.leasefs (on merged-/usr Debian, /sbin is /usr/sbin).
    install_file 0755 "$root/mount-scripts/mount.leasefs" /sbin/mount.fuse.leasefs
    install_file 0644 "$root/mount-scripts/leasefs@.service" /etc/systemd/system/leasefs@.service
    [[ ! -f $root/README.md ]] || install_file 0644 "$root/README.md" /usr/local/share/doc/leasefs/README.md
    if [[ -d /run/systemd/system ]]; then
        as_root systemctl daemon-reload
    fi
    bin=/usr/local/bin/leasefs
fi

# --- 5. FUSE over io_uring ------------------------------------------------------
if [[ $do_uring -eq 1 ]]; then
    if [[ $EUID -eq 0 ]]; then
        say "$("$root/mount-scripts/fuse-uring.sh")"
    elif command -v sudo >/dev/null 2>&1; then
        say "$(sudo "$root/mount-scripts/fuse-uring.sh")"
    else
        say "$("$root/mount-scripts/fuse-uring.sh")"
    fi
fi

# --- 6. Mount (only with --mount) ---------------------------------------------
if [[ -n $mountpoint_arg ]]; then
    mnt=$mountpoint_arg
    # type and source of whatever is mounted exactly at $mnt (empty when nothing is)
    read -r fstype fssource < <(findmnt -rn -M "$mnt" -o FSTYPE,SOURCE 2>/dev/null | tail -n1) || true
    if [[ -n ${fstype:-} ]]; then
        if stat "$mnt" >/dev/null 2>&1; then
            if [[ $fstype == fuse.leasefs || ($fstype == fuse* && $fssource == leasefs*) ]]; then
                say "mount: $mnt is already mounted ($fstype, $fssource)"
                exit 0
            fi
            die "$mnt already has another filesystem mounted on it ($fstype, $fssource)"
        fi
        say "mount: clearing dead mount on $mnt"
        fusermount3 -u -z "$mnt" 2>/dev/null || umount -l "$mnt"
    fi
    mkdir -p "$mnt"
    args=(mount "$mnt")
    [[ -z $data_arg ]] || args+=(--data "$data_arg")
    [[ -z $mount_opts ]] || args+=(-o "$mount_opts")
    say "mount: $bin ${args[*]}"
    "$bin" "${args[@]}"
    say "mount: ready — try: echo hello > $mnt/hello && getfattr -n user.leasefs.lease $mnt/hello"
fi
