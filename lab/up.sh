#!/usr/bin/env bash
# Bring up a local lab node named dflash-train and provision it with the real playbook:
# install the tools, build the lab images, start the node (a container that boots systemd),
# run ansible/site.yml against it with the lab inventory, then show `opsctl status` from the node.
#   lab/up.sh [NODE]        (NODE defaults to dflash-train)
#   lab/down.sh [NODE]      removes it
set -euo pipefail
cd "$(dirname "$0")/.."
node="${1:-dflash-train}"
t0=$(date +%s)
stage() { echo "[lab] $* (+$(( $(date +%s) - t0 )) s)" >&2; }

stage "installing tools"
scripts/bootstrap.sh
stage "building lab images"
lab/build-images.sh
stage "starting node $node"
lab/node.sh create "$node"
stage "provisioning $node with ansible/site.yml (lab inventory)"
# The lab inventory leaves the guard off (tests break engines on purpose); a lab node to try
# things on gets it, as production does.
(cd ansible && ../.venv/bin/ansible-playbook -i inventories/lab site.yml -l "$node" -e '{"opsctl_guard_enabled": true}')
stage "done; opsctl status on $node"
docker exec "$node" opsctl status
