#!/usr/bin/env bash
# Set up (if needed) and run the test suite on CPU: the README's second command.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
export TF_CPP_MIN_LOG_LEVEL=2
exec .venv/bin/python -m pytest -q "$@"
