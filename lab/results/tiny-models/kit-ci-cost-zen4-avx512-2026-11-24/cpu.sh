#!/bin/bash
# $1 = base|new (base: the kit of $BASE, an extracted older checkout, shadowing this one): CPU seconds (user+sys, children included) of the plugins' property tests and the mutation test, CI profile
cd "$(git rev-parse --show-toplevel)"
OUT=${OUT:-/tmp/kit-ci-cost}; mkdir -p "$OUT"
if [ "$1" = base ]; then export PYTHONPATH=$BASE/core; T=$BASE/tests/test_mutants.py; else T=tests/test_mutants.py; fi
export HYPOTHESIS_PROFILE=selfspec-ci
nice .venv/bin/python - "$1" "$T" "$OUT" <<'PY'
import resource, subprocess, sys, time
which, T, out = sys.argv[1], sys.argv[2], sys.argv[3]
root = T.rsplit("tests/", 1)[0] or "."
for name, cmd in (("plugins -k lossless", ["plugins", "-k", "lossless"]), ("test_mutants", ["--rootdir", root, T])):
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN); w0 = time.time()
    p = subprocess.run([".venv/bin/python", "-m", "pytest", "-q", "-p", "no:cacheprovider", *cmd, "--durations=0"],
                       capture_output=True, text=True)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN); w1 = time.time()
    open(f"{out}/{which}-{name.split()[0]}.log", "w").write(p.stdout + p.stderr)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    line = f"{which} {name}: cpu {cpu:.1f} s, wall {w1 - w0:.1f} s, rc {p.returncode}, {p.stdout.strip().splitlines()[-1]}"
    open(f"{out}/{which}.txt", "a").write(line + "\n")
PY
