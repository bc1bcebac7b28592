#!/bin/sh
# specdec --dtype bf16 check for every plugin on its four default prompts (32 new tokens each).
cd "$(dirname "$0")/../../.."
D=lab/results/smollm2-135m-instruct/check-bf16-zen4-avx512-2026-11-24
for p in vanilla lookup selfsd clasp selfdraft hispec fractal; do
  echo "== $p" >> $D/check.txt
  .venv/bin/specdec --threads 1 --dtype bf16 check --plugin $p >> $D/check.txt 2>&1
  echo "exit $?" >> $D/check.txt
done
