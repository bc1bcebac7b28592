#!/usr/bin/env bash
# before (main's code: 2 threads, OpenMP's default wait policy) vs after (this branch's default), interleaved
cd /work/wt-newcomer
P="Write a Python function that returns the n-th Fibonacci number."
for round in 1 2 3; do
  for cfg in before after; do
    load=$(cut -d' ' -f1 /proc/loadavg)
    case $cfg in
      before) out=$(env -u OMP_WAIT_POLICY /work/main/.venv/bin/specdec --json -n 32 "$P" 2>/tmp/nc-busy/err-$cfg-$round.txt);;
      after) out=$(env -u OMP_WAIT_POLICY .venv/bin/specdec --json -n 32 "$P" 2>/tmp/nc-busy/err-$cfg-$round.txt);;
    esac
    rec=$(echo "$out" | python3 -c "import json,sys; s=json.load(sys.stdin)['stats']; print(f\"{s['tokens_per_s']:.2f} tok/s, {s['new_tokens']} tokens, threads={s.get('threads')}, reason={s.get('threads_reason')}, omp={s.get('omp_wait_policy')}, load_start={s.get('load_average_start')}\")")
    echo "round=$round cfg=$cfg load_before=$load $rec"
  done
done
