#!/bin/bash
# device run: CUDA tests + Intel-host CPU checks. Usage: bash .devrun/run.sh [pytest -k expr]
set -u
cd "$(dirname "$0")/.."
T0=$SECONDS
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
lscpu | grep -E "Model name|^CPU\(s\)|Flags" | cut -c1-400
which gcc cc; gcc --version | head -1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .devrun/whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD/.devrun
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir --target /tmp/site . plugins/selfspec-* 2>&1 | tail -3
python3 -c "import torch, transformers, selfspec; print('torch', torch.__version__, 'tf', transformers.__version__, 'cuda', torch.cuda.is_available())" || exit 4
python3 -m pip list 2>/dev/null | grep -i -E "^(pytest|hypothesis|pytest-xdist|pytest-timeout|setuptools) " 
echo "setup done at $((SECONDS-T0)) s"
K="${1:-cuda}"
BUDGET="${2:-330}"
# A. the Intel host's CPU, 2 cores pinned, alone: product kernels against the streaming read
taskset -c 0,1 timeout 80 python3 lab/scripts/kernel_bandwidth.py --threads 2 --layers 8 --rows 1,8,32 --json $OUT/kernel_bw_intel.json 2>&1 | tail -8
echo "kernel bandwidth done at $((SECONDS-T0)) s"
export HYPOTHESIS_PROFILE=gpu SELFSPEC_SLOW=none PYTHONHASHSEED=0
LEFT=$((BUDGET-(SECONDS-T0)))
# B. the CPU tests that depend on the CPU's instruction set, on this Intel host
( FAIL_FILE=cpu_failures.txt timeout -s INT -k 15 $LEFT python3 -m pytest -p gpurun -p no:cacheprovider -q -n 2 --timeout 200 \
    ${CPU_TESTS:-tests/test_roofline.py} > $OUT/cpu.log 2>&1; echo "cpu tests rc=$?" >> $OUT/cpu.log ) &
# C. every CUDA-parametrized test
timeout -s INT -k 15 $LEFT python3 -m pytest -p gpurun -v -rf -n 12 -k "$K" --timeout 150 ${CUDA_PATHS:-tests plugins} 2>&1 | tee $OUT/cuda.log | grep -E "FAILED|ERROR|passed|failed|KeyboardInterrupt" | tail -30
grep -c "PASSED" $OUT/cuda.log
wait
tail -5 $OUT/cpu.log
echo "all done at $((SECONDS-T0)) s"
ls -la $OUT
