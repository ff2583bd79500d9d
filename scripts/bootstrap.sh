#!/usr/bin/env bash
# Install everything the lab and the tests need, from nothing, on a Debian machine:
# Debian packages, a running Docker engine, and the project's venv (.venv).
# Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { echo "[bootstrap] $*" >&2; }
# a command's output less pip's location warnings; with pipefail its own exit status still counts
quiet() { "$@" 2>&1 | { grep -v '^WARNING: Location' >&2 || true; }; }
# Root, not sudo here and there: Docker's socket, debootstrap and the lab's containers all need it.
[ "$(id -u)" = 0 ] || { say "run as root (sudo $0, or sudo lab/up.sh / sudo scripts/test.sh)"; exit 1; }

need_pkgs=()
# the engine, not only a client: a machine may carry a docker CLI without dockerd
command -v docker >/dev/null && command -v dockerd >/dev/null || need_pkgs+=(docker.io)
command -v debootstrap >/dev/null || need_pkgs+=(debootstrap)
command -v rsync >/dev/null || need_pkgs+=(rsync)
python3 -c 'import venv, ensurepip' 2>/dev/null || need_pkgs+=(python3-venv)
# the unit's helpers, which the tests run here: curl (the health gate), ss (the port check),
# systemd-analyze (the unit check)
command -v curl >/dev/null || need_pkgs+=(curl)
command -v ss >/dev/null || need_pkgs+=(iproute2)
command -v systemd-analyze >/dev/null || need_pkgs+=(systemd)
if [ ${#need_pkgs[@]} -gt 0 ]; then
    say "apt-get install ${need_pkgs[*]}"
    apt-get -o Acquire::Retries=3 update -qq
    DEBIAN_FRONTEND=noninteractive apt-get -o Acquire::Retries=3 install -y -qq "${need_pkgs[@]}" >/dev/null
fi

if ! docker info >/dev/null 2>&1; then
    if [ -d /run/systemd/system ]; then
        systemctl start docker
    elif grep -qsx dockerd /proc/[0-9]*/comm; then  # one still starting (or hung): a second would fight it for its socket
        say "waiting for the dockerd already running (log: /var/log/dockerd.log)"
    else
        say "starting dockerd (log: /var/log/dockerd.log)"
        sh -c 'nohup dockerd >>/var/log/dockerd.log 2>&1 &'
    fi
    for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
    docker info >/dev/null 2>&1 || { say "the Docker engine did not start: see /var/log/dockerd.log"; exit 1; }
fi

# (this script's own pins, below, count too)
stamp=.venv/.installed-$(cat pyproject.toml kernels/pyproject.toml constraints.txt scripts/bootstrap.sh | sha256sum | cut -c1-16)
if [ ! -e "$stamp" ]; then
    say "creating .venv with the project and its dev tools"
    # a venv an interrupted run left without a working pip is made again
    .venv/bin/python -m pip --version >/dev/null 2>&1 || python3 -m venv --clear .venv
    quiet .venv/bin/pip install -q --upgrade pip
    quiet .venv/bin/pip install -q -c constraints.txt -e '.[dev]'
    # The kernel package and its CPU tests (Triton's interpreter). torch 2.13.0 resolves to the CPU
    # build this machine kind keeps on disk; elsewhere add --index-url of PyTorch's CPU wheels.
    # Triton 3.6.0 is the one the GPU machine runs (kernels/README.md: 3.8.0, SGLang's, is built
    # in the image test).
    quiet .venv/bin/pip install -q torch==2.13.0 triton==3.6.0 -e 'kernels[dev]'
    .venv/bin/python -c 'import opsctl, ansible, molecule, testinfra, dflash_kernels' \
        || { say "venv install failed"; exit 1; }
    touch "$stamp"
fi
say "ready: docker $(docker version --format '{{.Server.Version}}'), $(.venv/bin/ansible --version | head -1)"
