#!/usr/bin/env bash
# Build the lab's images from Debian's packages (no Docker Hub needed):
#   dflash-lab/debian:bookworm         debootstrapped minimal Debian, imported with `docker import`
#   dflash-lab/debian-python:bookworm  + python3, aiohttp, prometheus_client (engine simulator base)
#   dflash-lab/node:bookworm           + systemd: the lab node the playbook provisions
# and save the python base to .lab/images/ so lab nodes (which cannot pull) can load it.
# Images that exist are kept while their build context (Dockerfile, the host's CA) is unchanged:
# each carries its context's hash in a label. FORCE=1 rebuilds them.
set -euo pipefail
cd "$(dirname "$0")/.."
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
force="${FORCE:-0}"
mkdir -p .lab/images .lab/cache
scratch=()
trap 'rm -rf "${scratch[@]}"' EXIT

say() { echo "[build-images] $*" >&2; }
context_hash() { cat "$@" | sha256sum | cut -c1-16; }
# have IMAGE [HASH]: the image exists (built from a context with this hash)
have() {
    [ "$force" != 1 ] || return 1
    local label
    label=$(docker image inspect --format '{{ index .Config.Labels "dflash.lab.context" }}' "$1" 2>/dev/null) || return 1
    [ -z "${2:-}" ] || [ "$label" = "$2" ]
}

if ! have dflash-lab/debian:bookworm; then
    rootfs=.lab/cache/debian-bookworm.tar
    if [ ! -s "$rootfs" ] || [ "$force" = 1 ]; then
        say "debootstrap bookworm from $mirror (about a minute)"
        dir=$(mktemp -d); scratch+=("$dir")
        debootstrap --variant=minbase bookworm "$dir" "$mirror" >.lab/cache/debootstrap.log 2>&1 \
            || { tail -20 .lab/cache/debootstrap.log >&2; exit 1; }
        tar -C "$dir" -cf "$rootfs.tmp" . && mv "$rootfs.tmp" "$rootfs"
        rm -rf "$dir"
    fi
    docker import "$rootfs" dflash-lab/debian:bookworm >/dev/null
    say "dflash-lab/debian:bookworm imported"
fi

python_hash=$(context_hash images/lab-python/Dockerfile)
if ! have dflash-lab/debian-python:bookworm "$python_hash"; then
    docker build -q --label "dflash.lab.context=$python_hash" -t dflash-lab/debian-python:bookworm \
        images/lab-python >/dev/null
    say "dflash-lab/debian-python:bookworm built"
fi

node_hash=$(context_hash images/lab-node/Dockerfile /etc/ssl/certs/ca-certificates.crt)
if ! have dflash-lab/node:bookworm "$node_hash"; then
    context=$(mktemp -d); scratch+=("$context")
    cp images/lab-node/Dockerfile "$context/"
    cp /etc/ssl/certs/ca-certificates.crt "$context/host-ca.crt"
    docker build -q --label "dflash.lab.context=$node_hash" -t dflash-lab/node:bookworm "$context" >/dev/null
    say "dflash-lab/node:bookworm built"
fi

# The lab nodes load the python base from this archive: saved again whenever the image changed.
archive=.lab/images/debian-python.tar
image_id=$(docker image inspect --format '{{.Id}}' dflash-lab/debian-python:bookworm)
if [ ! -s "$archive" ] || [ "$(cat "$archive.id" 2>/dev/null)" != "$image_id" ]; then
    docker save dflash-lab/debian-python:bookworm -o "$archive.tmp" && mv "$archive.tmp" "$archive"
    echo "$image_id" > "$archive.id"
    say "saved $archive"
fi
