#!/usr/bin/env bash
# Set up .venv for this checkout on a machine without a GPU (idempotent; ~2-3 minutes when fresh).
#   bash scripts/setup.sh            TF + JAX + DALI (+ DALI TF plugin) on CPU, test tools
# Stages: (1) TF, JAX, DALI and the rest, pinned by requirements/constraints-cpu.txt;
#         (2) the DALI TF plugin, which compiles against the installed TF (--no-build-isolation).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

find_python() {
  if [[ -n "${PYTHON:-}" ]]; then echo "$PYTHON"; return; fi
  local cand
  for cand in python3.12 "$(pyenv root 2>/dev/null)"/versions/3.12*/bin/python3.12 python3; do
    if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then
      echo "$cand"; return
    fi
  done
  echo "error: Python 3.12 not found (the pinned JAX 0.11.2 needs it; the GPU machine runs 3.12). Set PYTHON=/path/to/python3.12" >&2
  exit 2
}

stamp=.venv/.setup-done
want="$(sha1sum requirements/constraints-cpu.txt pyproject.toml | sha1sum | cut -c1-12)"
if [[ -f $stamp && "$(cat $stamp)" == "$want" ]]; then
  echo "setup: .venv is up to date"; exit 0
fi
PY=$(find_python)
[[ -x .venv/bin/python ]] || "$PY" -m venv .venv
export PIP_DISABLE_PIP_VERSION_CHECK=1
export TF_CPP_MIN_LOG_LEVEL=2  # stage 2 imports TensorFlow: no C++ start-up lines
# pip, minus this image's warnings about absent local indexes; pip's own exit status is kept.
pip_install() { .venv/bin/python -m pip install -q "$@" 2>&1 | { grep -v "is ignored" || true; }; return "${PIPESTATUS[0]}"; }
pip_install --upgrade pip
echo "setup: stage 1/2: TensorFlow, JAX, DALI and the rest (pinned; ~1 minute from pip's cache, a few on a first download of ~1 GB)"
pip_install -c requirements/constraints-cpu.txt -e ".[tf,jax,dali,nvtx,camb,test]"
echo "setup: stage 2/2: DALI TF plugin (built against the installed TensorFlow; seconds)"
pip_install --no-build-isolation -c requirements/constraints-cpu.txt nvidia-dali-tf-plugin-cuda130
.venv/bin/python - <<'PY'
import importlib
for mod in ("tensorflow", "jax", "flax", "optax", "orbax.checkpoint", "nvidia.dali", "nvidia.dali.plugin.tf", "nvidia.dali.plugin.jax", "h5py"):
    importlib.import_module(mod)
print("setup: all imports OK")
PY
echo "$want" > $stamp
