#!/usr/bin/env bash
# Create or remove a lab node: a container that boots systemd and runs its own Docker engine
# (its /var/lib/docker is a volume, so the engine inside uses overlay2 like a real node).
#   lab/node.sh create NAME     start the node and wait until systemd is up
#   lab/node.sh destroy NAME    remove the node and its Docker volume
set -euo pipefail
cd "$(dirname "$0")/.."
action="${1:?usage: lab/node.sh create|destroy NAME}"
name="${2:?usage: lab/node.sh create|destroy NAME}"
image="${LAB_NODE_IMAGE:-dflash-lab/node:bookworm}"

case "$action" in
create)
    if docker container inspect "$name" >/dev/null 2>&1; then
        if [ "$(docker container inspect --format '{{.State.Running}}' "$name")" = true ]; then
            echo "[node] $name exists" >&2
        else  # (stopped: a Docker engine restarted since, or a machine rebooted) systemd boots again
            docker start "$name" >/dev/null
            echo "[node] $name was stopped: started again" >&2
        fi
    else
        # Not --privileged (refused here): the capabilities systemd and a nested dockerd need.
        docker run --detach --name "$name" --hostname "$name" \
            --cap-add SYS_ADMIN --cap-add NET_ADMIN \
            --security-opt seccomp=unconfined --security-opt apparmor=unconfined \
            --tmpfs /run --tmpfs /run/lock \
            --volume /sys/fs/cgroup:/sys/fs/cgroup:rw \
            --volume "dflash-lab-$name-docker:/var/lib/docker" \
            --volume "$PWD/.lab/images:/srv/lab-images:ro" \
            --label dflash-lab-node=1 \
            "$image" >/dev/null
        echo "[node] $name started" >&2
    fi
    for _ in $(seq 60); do
        state=$(docker exec "$name" systemctl is-system-running 2>/dev/null || true)
        case "$state" in running|degraded) echo "[node] $name: systemd $state" >&2; exit 0 ;; esac
        sleep 1
    done
    echo "[node] $name: systemd did not come up (state: ${state:-none})" >&2
    exit 1
    ;;
destroy)
    docker rm --force "$name" >/dev/null 2>&1 || true
    docker volume rm "dflash-lab-$name-docker" >/dev/null 2>&1 || true
    echo "[node] $name removed" >&2
    ;;
*)
    echo "usage: lab/node.sh create|destroy NAME" >&2
    exit 2
    ;;
esac
