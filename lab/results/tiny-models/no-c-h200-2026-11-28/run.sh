#!/bin/bash
# device run after the C kernel's removal: every CUDA-parametrized test on the GPU, and on the
# host's Intel CPU the weight-format tests and the library kernels' timings (kernels_bench).
set -u
cd "$(dirname "$0")/../../../.."
T0=$SECONDS
BUDGET="${1:-480}"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
lscpu | grep -E "Model name|^CPU\(s\)" ; lscpu | grep Flags | grep -o -E "avx512[a-z_0-9]*|amx[a-z_0-9]*|avx2|fma" | sort -u | tr '\n' ' '; echo
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .devrun/whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD/.devrun
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir --target /tmp/site . plugins/selfspec-* 2>&1 | tail -3
python3 -c "import torch, transformers, selfspec; print('torch', torch.__version__, 'tf', transformers.__version__, 'cuda', torch.cuda.is_available())" || exit 4
echo "setup done at $((SECONDS-T0)) s"
export HYPOTHESIS_PROFILE=gpu SELFSPEC_SLOW=none PYTHONHASHSEED=0
LEFT=$((BUDGET-(SECONDS-T0)))
( FAIL_FILE=cpu_failures.txt taskset -c 0,1 timeout -s INT -k 15 $((LEFT-150)) python3 -m pytest -p gpurun -p no:cacheprovider -q -n 2 --timeout 200 \
    tests/test_formats.py tests/test_draftweights.py tests/test_layout_choice.py tests/test_calibration.py > $OUT/cpu.log 2>&1; echo "cpu tests rc=$?" >> $OUT/cpu.log
  taskset -c 0 timeout 140 python3 ../shared/tools/kernels_bench.py --threads 1 --layers 9 --rows 1,4,16 --budget 1 \
    --skip ss-,ao-,bnb,openblas,dynquant > $OUT/kernels_intel.md 2> $OUT/kernels_intel.err || \
  taskset -c 0 timeout 140 python3 .devrun/kernels_bench.py --threads 1 --layers 9 --rows 1,4,16 --budget 1 \
    --skip ss-,ao-,bnb,openblas,dynquant > $OUT/kernels_intel.md 2> $OUT/kernels_intel.err ) &
taskset -c 2-15 timeout -s INT -k 15 $LEFT python3 -m pytest -p gpurun -p no:cacheprovider -v -rf -n 10 -k cuda --timeout 200 \
    tests plugins 2>&1 | tee $OUT/cuda.log | grep -E "FAILED|ERROR|passed|failed|KeyboardInterrupt" | tail -30
echo "cuda PASSED lines: $(grep -c PASSED $OUT/cuda.log)"
wait
tail -4 $OUT/cpu.log
echo "all done at $((SECONDS-T0)) s"
ls -la $OUT
