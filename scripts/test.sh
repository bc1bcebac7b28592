#!/usr/bin/env bash
# The whole test suite from a fresh clone: a small virtualenv with tox, then tox (lint + tests).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv-tox/bin/tox ]; then
  python3 -m venv .venv-tox
  .venv-tox/bin/python -m pip install -q --upgrade pip
  .venv-tox/bin/python -m pip install -q "tox>=4.20"
fi
if [ "$#" -gt 0 ]; then
  exec .venv-tox/bin/tox run -e lint,py -- "$@"
fi
exec .venv-tox/bin/tox run -e lint,py
