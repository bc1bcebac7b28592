#!/usr/bin/env bash
# specdec serve on Qwen2.5-Coder-1.5B: one curl chat completion (128 tokens, greedy) to
# --plugin selfsd, then to --plugin vanilla, one server at a time; tokens/s from the answer's
# usage and selfspec stats, and the client-side wall time.
set -euo pipefail
cd "$(dirname "$0")"
MODEL="${MODEL:-qwen2.5-coder-1.5b}"
PORT="${PORT:-8765}"
PROMPT='Write a Python function that parses an ISO 8601 date string and returns a datetime, with error handling and a docstring.'
for PLUGIN in selfsd vanilla; do
  specdec serve --model "$MODEL" --plugin "$PLUGIN" --port "$PORT" 2> "server-$PLUGIN.log" &
  PID=$!
  until curl -sf "http://127.0.0.1:$PORT/health" > /dev/null; do sleep 2; done
  START=$(date +%s.%N)
  curl -s "http://127.0.0.1:$PORT/v1/chat/completions" -H 'Content-Type: application/json' \
    -d "{\"model\": \"$(curl -s http://127.0.0.1:$PORT/v1/models | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])')\",
         \"messages\": [{\"role\": \"user\", \"content\": \"$PROMPT\"}], \"max_tokens\": 128, \"temperature\": 0}" \
    > "answer-$PLUGIN.json"
  END=$(date +%s.%N)
  echo "$PLUGIN client_wall_s $(python3 -c "print(round($END - $START, 2))")" >> client-times.txt
  kill -TERM "$PID"; wait "$PID"
done
