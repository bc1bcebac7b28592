#!/usr/bin/env bash
# interleaved: default 2 threads (OMP default wait policy) / 1 thread / 2 threads PASSIVE
cd /work/wt-newcomer
P="Write a Python function that returns the n-th Fibonacci number."
for round in 4 5 6; do
  for cfg in t1 t2passive; do
    load=$(cut -d' ' -f1 /proc/loadavg)
    case $cfg in
      t2) out=$(env -u OMP_WAIT_POLICY .venv/bin/specdec --threads 2 --json -n 48 "$P" 2>/dev/null);;
      t1) out=$(env -u OMP_WAIT_POLICY .venv/bin/specdec --threads 1 --json -n 48 "$P" 2>/dev/null);;
      t2passive) out=$(OMP_WAIT_POLICY=PASSIVE .venv/bin/specdec --threads 2 --json -n 48 "$P" 2>/dev/null);;
    esac
    tps=$(echo "$out" | python3 -c "import json,sys; s=json.load(sys.stdin)['stats']; print(f\"{s['tokens_per_s']:.2f} {s['new_tokens']}\")")
    echo "round=$round cfg=$cfg load_before=$load tok_s,new=$tps"
  done
done
