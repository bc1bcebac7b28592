#!/bin/bash
# CI-profile cost of two plugin suites: the parent of the kit branch (60c8c2a, /tmp/kit-base) vs this branch
export HYPOTHESIS_PROFILE=selfspec-ci PYTHONHASHSEED=0 SELFSPEC_SLOW=ci
PY=/work/wt-kit/.venv/bin/python
for plugin in lookup selfdraft; do
  for side in base new; do
    if [ $side = base ]; then dir=/tmp/kit-base; pp=/tmp/kit-base/core:/tmp/kit-base/plugins/selfspec-$plugin; else dir=/work/wt-kit; pp=; fi
    cd $dir  # base: /tmp/kit-base (git archive 60c8c2a); new: this tree
    echo "== $plugin $side load: $(cut -d' ' -f1-3 /proc/loadavg)"
    PYTHONPATH=$pp /usr/bin/time -f "$plugin $side: %e s wall, %U s user, %S s sys" nice $PY -m pytest -q -p no:cacheprovider plugins/selfspec-$plugin/tests 2>&1 | tail -2
  done
done
