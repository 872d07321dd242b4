#!/usr/bin/env bash
# Set up (if needed), check the style (ruff) and run the test suite on CPU: the README's second command.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
export TF_CPP_MIN_LOG_LEVEL=2
.venv/bin/ruff check . && .venv/bin/ruff format --check . >/dev/null || { echo "test: ruff found style errors (ruff check . / ruff format .)"; exit 1; }
exec .venv/bin/python -m pytest -q "$@"
