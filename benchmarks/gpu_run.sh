#!/usr/bin/env bash
# Everything to check on a lent GPU, in one scripted call (see benchmarks/NOTES.md).
#   bash benchmarks/gpu_run.sh [generated] [record] [small] [instructions] [tests] [nbval] [execute] [pack]
#                                                                   (default: all but small and instructions)
#   SUITES="lesson4 lesson7" bash benchmarks/gpu_run.sh record      (one file per suite in $OUT)
#   PYTEST_ARGS="-n 8 --dist loadfile" TESTS=... NOTEBOOKS=... (pytest-xdist from .whl, see NOTES.md)
# Writes logs and results under $OUT (default ./out). Needs the wheels of ../shared/tools/gpu-wheelhouse.sh
# in .whl/ for nbval (the GPU machine has torch/triton/pytest but no Jupyter).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
stages=${*:-generated record tests nbval execute}
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
python3 -c "import fusionlab; print(fusionlab.info())" | tee "$OUT/info.txt"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv | tee -a "$OUT/info.txt"
for s in $stages; do
  echo "=== $s ==="
  case $s in
    tests) timeout ${TESTS_TIMEOUT:-300} python3 -m pytest ${TESTS:-tests} ${PYTEST_ARGS:-} -q -p no:cacheprovider 2>&1 | tee "$OUT/pytest.log" | tail -25 ;;
    record) # one process and one file per suite, so a slow or failing suite costs only itself
            for suite in ${SUITES:-$(python3 -c "from fusionlab.lessons import SUITES; print(' '.join(SUITES))")}; do
              echo "--- $suite (timeout ${SUITE_TIMEOUT:-200} s), $(date +%T)" | tee -a "$OUT/record.log"
              SECONDS=0
              timeout "${SUITE_TIMEOUT:-200}" python3 -m fusionlab.record --suites "$suite" --out "$OUT/recorded-$suite.json" 2>&1 \
                | tee -a "$OUT/record.log" | tail -40
              echo "--- $suite took $SECONDS s" | tee -a "$OUT/record.log"
            done ;;
    small) timeout 300 python3 benchmarks/small_tensors.py --out "$OUT/small_tensors.json" 2>&1 | tee "$OUT/small.log" | tail -50 ;;
    instructions) # lesson 2's counts, compiled for sm_90 by this machine's Triton (compare with the CPU's)
           python3 -c "
import torch, triton
from fusionlab.lessons.l2.instructions import bias_gelu_instructions
for dt in (torch.float32, torch.bfloat16):
    for a in ('none', 'tanh', 'erf_fast'):
        print('triton', triton.__version__, dt, a, bias_gelu_instructions(dt, a))
" 2>&1 | tee "$OUT/instructions.log" ;;
    pack) # the device returns at most 8 files: everything in one archive
          tar -C "$OUT" -czf /tmp/out.tgz . && find "$OUT" -mindepth 1 -delete && mv /tmp/out.tgz "$OUT/out.tgz" ;;
    tune) [ -f benchmarks/probes/tune.py ] && timeout 300 python3 benchmarks/probes/tune.py 2>&1 | tee "$OUT/tune.log" | tail -40 ;;
    generated) python3 -m fusionlab.lessons.l3.generated_code --save "$OUT/generated" 2>&1 | tail -5 \
                 && tar -C "$OUT" -czf "$OUT/generated.tgz" generated && rm -rf "$OUT/generated" ;;
    execute) # run every lesson and solution here, as a learner would, and bring the outputs back
             rm -rf /tmp/gpu_nb && mkdir -p /tmp/gpu_nb && cp -r notebooks solutions /tmp/gpu_nb/ \
               && timeout 560 python3 scripts/run_notebooks.py --keep-env --no-exercises /tmp/gpu_nb/notebooks/*.ipynb \
                    /tmp/gpu_nb/solutions/*.ipynb 2>&1 | grep -v WARNING | tail -12 \
               && tar -C /tmp/gpu_nb -czf "$OUT/gpu_notebooks.tgz" notebooks solutions ;;
    nbval) timeout ${NBVAL_TIMEOUT:-540} python3 -m pytest --nbval ${NOTEBOOKS:-notebooks solutions} ${PYTEST_ARGS:-} --nbval-current-env \
             --nbval-sanitize-with nbval_sanitize.cfg -p no:cacheprovider -q 2>&1 | tee "$OUT/nbval.log" | tail -30 ;;
  esac
done
