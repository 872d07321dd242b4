#!/usr/bin/env bash
# Set up (if needed), check the style (ruff) and run the test suite on CPU: the README's second command.
usage="usage: bash scripts/test.sh [--fast] [PYTEST ARGUMENTS]
Set up .venv (scripts/setup.sh), check the style (ruff check, ruff format --check) and run the test
suite on CPU (tests marked gpu skip themselves without a GPU), in 2 worker processes (pytest-xdist,
each test file on one worker; -n 0 runs them in this process, -n N in N workers).
  --fast        the unit tier only: not slow, not gpu, not study (under 2 minutes on 2 cores)
  -h, --help    this message
Other arguments go to pytest, e.g. bash scripts/test.sh -k resume; bash scripts/test.sh tests/test_config.py"
tier=()
args=()
for arg in "$@"; do
  case "$arg" in
    -h | --help) echo "$usage"; exit 0 ;;
    --fast) tier=(-m "not slow and not gpu and not study") ;;
    --*) # pytest's own long flags pass (pytest refuses unknown ones); a misspelt --fast stops here
      if python3 -c 'import difflib, sys; sys.exit(difflib.SequenceMatcher(None, sys.argv[1], "--fast").ratio() < 0.75)' "$arg"; then
        echo "error: scripts/test.sh: unknown argument '$arg' (did you mean '--fast'?)" >&2; exit 2
      fi
      args+=("$arg") ;;
    *) args+=("$arg") ;;
  esac
done
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
export TF_CPP_MIN_LOG_LEVEL=2
.venv/bin/ruff check . && .venv/bin/ruff format --check . >/dev/null || { echo "test: ruff found style errors (ruff check . / ruff format .)"; exit 1; }
exec .venv/bin/python -m pytest -q -n 2 --dist loadfile "${tier[@]}" "${args[@]}"
