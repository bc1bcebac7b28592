#!/bin/sh
# The 135M bench in float32 and in bf16, the two runs side by side (each its own process; in
# each run every method is interleaved prompt by prompt with HF greedy of the same dtype).
cd "$(dirname "$0")/../.."
for dt in float32 bf16; do
  .venv/bin/specdec bench --dtype $dt --threads 1 --tasks humaneval,gsm8k,mtbench,sharegpt --samples 1 \
    --max-new-tokens 32 --no-peers --allow-divergence -q \
    --out results/smollm2-135m-instruct/bench-$dt-zen4-avx512-2026-11-24 > /tmp/bench-$dt.log 2>&1 &
done
wait
