#!/usr/bin/env bash
# Remove a lab node made by lab/up.sh (default dflash-train) and its Docker volume.
set -euo pipefail
cd "$(dirname "$0")/.."
lab/node.sh destroy "${1:-dflash-train}"
