#!/usr/bin/env bash
# Build an isolated virtualenv that can import the real SGLang server-args
# parser (sglang.srt.server_args) on a CPU-only machine.
#
#   scripts/sglang-real-env.sh [VENV_DIR]      (default: <repo>/.venv-sglang)
#
# SGLang is installed with --no-deps: its declared requirements pull CUDA
# kernels and a CUDA torch (many GB). Instead we install the packages that
# `import sglang.srt.server_args` actually needs, found by trial, pinned.
#
# torch must be a CPU build: the pin below carries the "+cpu" local version,
# which no CUDA wheel on PyPI can satisfy, so pip can never fall back to a
# CUDA torch. PyPI has no such build: pip looks in its configured sources
# (find-links, extra index), then in SGLANG_REAL_TORCH_INDEX (default: the
# PyTorch CPU index), an extra index for the torch step only.
#
# Idempotent: when VENV_DIR already holds a complete install of the same
# package set (stamp file + a successful import), it does nothing.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV_DIR="${1:-$REPO_ROOT/.venv-sglang}"
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3

SGLANG_SPEC="sglang==0.5.23"
TORCH_SPEC="torch==2.13.0+cpu"
# What `import sglang.srt.server_args` + ServerArgs.add_cli_args() +
# prepare_server_args() need besides torch, each pinned (all pure Python or
# small binary wheels). Found by importing, reading the ModuleNotFoundError,
# adding the package, repeating.
LIGHT_DEPS=(
  msgspec==0.23.0        # ServerArgs is a msgspec Struct
  numpy==2.4.6           # sglang.srt.utils.common
  triton==3.9.0          # sglang.srt.utils.common imports it at top level (no GPU needed)
  orjson==3.13.0
  psutil==7.2.2
  pybase64==1.5.1
  requests==2.34.2 urllib3==2.8.0 idna==3.20 certifi==2026.10.19.post1
  typing_extensions==4.16.0
  packaging==26.4
  pillow==13.0.0
  starlette==1.10.0 anyio==4.16.0
  pydantic==2.14.4 pydantic_core==2.50.5 typing-inspection==0.4.5
  pyzmq==27.3.0
  tqdm==4.70.1
  ipython==9.18.1 traitlets==5.16.1 Pygments==2.21.0
  aiohttp==3.14.5 multidict==7.2.1 attrs==26.1.0 yarl==1.25.1 propcache==0.5.4
  aiohappyeyeballs==2.7.1 aiosignal==1.4.0 frozenlist==1.8.0
  pyyaml==6.0.3          # --config FILE support (server_args_config_parser)
  safetensors==0.8.0     # imported by the cuda-graph / memory resolution hooks
)
CHECK='import argparse, sglang, sglang.srt.server_args as m; p = argparse.ArgumentParser(); m.ServerArgs.add_cli_args(p); assert sglang.__version__ == "0.5.23", sglang.__version__'
STAMP_TEXT="$SGLANG_SPEC $TORCH_SPEC ${LIGHT_DEPS[*]}"
STAMP="$VENV_DIR/.sglang-real-complete"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$STAMP_TEXT" ]] \
   && "$VENV_DIR/bin/python" -W ignore -c "$CHECK" >/dev/null 2>&1; then
  echo "sglang-real-env: $VENV_DIR is complete, nothing to do"
  exit 0
fi

start=$(date +%s)
echo "sglang-real-env: building $VENV_DIR with $("$PYTHON" --version 2>&1)"
rm -f "$STAMP"
[[ -x "$VENV_DIR/bin/python" ]] || "$PYTHON" -m venv "$VENV_DIR"
PIP=("$VENV_DIR/bin/python" -m pip install --disable-pip-version-check --no-input --no-deps)

TORCH_INDEX="${SGLANG_REAL_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"
echo "sglang-real-env: installing $TORCH_SPEC (CPU build, --no-deps)"
first_try="$(mktemp)"
trap 'rm -f "$first_try"' EXIT
if ! "${PIP[@]}" --only-binary=:all: "$TORCH_SPEC" 2>"$first_try"; then
  echo "sglang-real-env: not found in pip's configured sources; trying $TORCH_INDEX"
  if ! "${PIP[@]}" --only-binary=:all: --extra-index-url "$TORCH_INDEX" "$TORCH_SPEC"; then
    echo "sglang-real-env: pip's configured sources said:" >&2
    sed 's/^/  /' "$first_try" >&2
    echo "sglang-real-env: no CPU build of torch ($TORCH_SPEC) is reachable." >&2
    echo "  Set SGLANG_REAL_TORCH_INDEX to a CPU wheel index; a CUDA torch is refused on purpose." >&2
    exit 3
  fi
fi

echo "sglang-real-env: installing $SGLANG_SPEC (--no-deps) and ${#LIGHT_DEPS[@]} light dependencies"
"${PIP[@]}" --only-binary=:all: "$SGLANG_SPEC" "${LIGHT_DEPS[@]}"

"$VENV_DIR/bin/python" -W ignore -c "$CHECK"
"$VENV_DIR/bin/python" -c 'import torch; assert torch.version.cuda is None, "CUDA torch installed"'
echo "$STAMP_TEXT" > "$STAMP"

echo "sglang-real-env: installed (in $(( $(date +%s) - start ))s):"
"$VENV_DIR/bin/python" -m pip list --disable-pip-version-check --format=freeze 2>/dev/null | grep -v '^pip=\|^setuptools=' | sed 's/^/  /'
echo "sglang-real-env: venv size $(du -sh "$VENV_DIR" | cut -f1)"
