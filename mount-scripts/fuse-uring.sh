#!/usr/bin/env bash
# fuse-uring.sh — lets FUSE daemons that ask for it take their requests
# through io_uring (Linux 6.14+): sets the fuse module parameter
# enable_uring. It changes nothing for a FUSE daemon that does not ask
# (the kernel uses the rings of a connection only when its daemon requests
# them at INIT); leasefs asks unless mounted with -o fuse_uring=off
# (docs/SEMANTICS.md "The daemon"). Idempotent; needs root to change the
# setting, and says so, exiting 0, where it cannot (older kernel, not root).
# Exit status: 0, or 1 when writing the parameter failed.
set -u
p=/sys/module/fuse/parameters/enable_uring
if [[ ! -e $p ]]; then
    # A modular fuse not loaded yet.
    modprobe fuse 2>/dev/null || true
fi
if [[ ! -e $p ]]; then
    echo "fuse-uring: this kernel ($(uname -r)) has no FUSE over io_uring: leasefs uses /dev/fuse"
    exit 0
fi
if [[ $(cat "$p") == Y ]]; then
    echo "fuse-uring: FUSE over io_uring is enabled"
    exit 0
fi
if [[ $EUID -ne 0 ]]; then
    echo "fuse-uring: FUSE over io_uring is off and only root can turn it on (echo Y > $p): leasefs uses /dev/fuse"
    exit 0
fi
if echo Y >"$p" 2>/dev/null; then
    echo "fuse-uring: FUSE over io_uring enabled ($p)"
else
    echo "fuse-uring: cannot write $p" >&2
    exit 1
fi
