#!/usr/bin/env bash
# Set up (if needed), check the style (ruff) and run the test suite on CPU: the README's second command.
#   bash scripts/test.sh            everything (tests marked gpu skip themselves without a GPU)
#   bash scripts/test.sh --fast     the unit tier: not slow, not gpu, not study (about a minute)
# Other arguments go to pytest (bash scripts/test.sh -k resume, bash scripts/test.sh -m gpu).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
tier=()
if [[ "${1:-}" == "--fast" ]]; then
  shift
  tier=(-m "not slow and not gpu and not study")
fi
bash scripts/setup.sh
export TF_CPP_MIN_LOG_LEVEL=2
.venv/bin/ruff check . && .venv/bin/ruff format --check . >/dev/null || { echo "test: ruff found style errors (ruff check . / ruff format .)"; exit 1; }
exec .venv/bin/python -m pytest -q "${tier[@]}" "$@"
