#!/usr/bin/env bash
# Build the lab's images from Debian's packages (no Docker Hub needed):
#   dflash-lab/debian:bookworm         debootstrapped minimal Debian, imported with `docker import`
#   dflash-lab/debian-python:bookworm  + python3, aiohttp, prometheus_client (engine simulator base)
#   dflash-lab/node:bookworm           + systemd: the lab node the playbook provisions
# and save the python base to .lab/images/ so lab nodes (which cannot pull) can load it.
# Images that exist are kept; FORCE=1 rebuilds them.
set -euo pipefail
cd "$(dirname "$0")/.."
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
force="${FORCE:-0}"
mkdir -p .lab/images .lab/cache

have() { [ "$force" != 1 ] && docker image inspect "$1" >/dev/null 2>&1; }
say() { echo "[build-images] $*" >&2; }

if ! have dflash-lab/debian:bookworm; then
    rootfs=.lab/cache/debian-bookworm.tar
    if [ ! -s "$rootfs" ] || [ "$force" = 1 ]; then
        say "debootstrap bookworm from $mirror (about a minute)"
        dir=$(mktemp -d)
        debootstrap --variant=minbase bookworm "$dir" "$mirror" >.lab/cache/debootstrap.log 2>&1 \
            || { tail -20 .lab/cache/debootstrap.log >&2; exit 1; }
        tar -C "$dir" -cf "$rootfs.tmp" . && mv "$rootfs.tmp" "$rootfs"
        rm -rf "$dir"
    fi
    docker import "$rootfs" dflash-lab/debian:bookworm >/dev/null
    say "dflash-lab/debian:bookworm imported"
fi

if ! have dflash-lab/debian-python:bookworm; then
    docker build -q -t dflash-lab/debian-python:bookworm images/lab-python >/dev/null
    say "dflash-lab/debian-python:bookworm built"
fi

if ! have dflash-lab/node:bookworm; then
    context=$(mktemp -d)
    cp images/lab-node/Dockerfile "$context/"
    cp /etc/ssl/certs/ca-certificates.crt "$context/host-ca.crt"
    docker build -q -t dflash-lab/node:bookworm "$context" >/dev/null
    rm -rf "$context"
    say "dflash-lab/node:bookworm built"
fi

archive=.lab/images/debian-python.tar
if [ ! -s "$archive" ] || [ "$force" = 1 ]; then
    docker save dflash-lab/debian-python:bookworm -o "$archive.tmp" && mv "$archive.tmp" "$archive"
    say "saved $archive"
fi
