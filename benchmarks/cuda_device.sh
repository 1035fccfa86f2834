#!/usr/bin/env bash
# GPU-side steps of the CUDA backend, run on the lent H100 by the device tool (see docs/benchmarks.md).
# Results that come back go into docs/results/<benchmark>/<run>.json with "command", "machine" and "date"
# added (kernelbench_cuda, cuda_bandwidth, cuda_blocks, ...); then python -m benchmarks.render:
#   bash benchmarks/cuda_device.sh STEP...    steps: setup tests overhead bandwidth gap kgap sweep blocks bench zoo cpu
# Writes results under $OUT (default ./device_out), logs under /tmp. Needs .whl/ (platformdirs wheel) and
# .kb/problems.jsonl (a copy of ../shared/kernelbench/problems.jsonl) carried along.
# DEADLINE (seconds since the script started, default 570): the bench is interrupted then and writes what it has.
# ATTEMPTED= (empty) also runs problems without a candidate (torch.compile against eager only).
# CPU_KEYS="L1_4 L1_100 ..." (step cpu): the CPU backend on this host's CPU, one bench per problem, for problems
# whose inputs or weights are too large for the 24 GB CPU machine; the GPU is hidden.
set -o pipefail
START=$(date +%s)
OUT=${OUT:-device_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PROBLEMS=${PROBLEMS:-.kb/problems.jsonl}
for step in "$@"; do
  case $step in
    setup)
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
      export PYTHONPATH=/tmp/site
      python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
      { nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
        python3 -m pip show cuda-bindings cuda-python cupy-cuda13x nvidia-cuda-nvrtc 2>/dev/null | grep -E "^(Name|Version)"
        python3 -c "import json, metal_accel.backends.cuda.backend as c; print(json.dumps(c.describe())); print(c.toolkit_include_dirs())"
        metal-accel doctor; } > "$OUT/env.txt" 2>&1 ;;
    tests)  # the GPU tests (the compile-everything tests need no GPU and run in CI)
      python3 -m pytest -p no:cacheprovider tests/test_cuda_backend.py -v -rs > "$OUT/pytest_cuda.log" 2>&1
      tail -3 "$OUT/pytest_cuda.log" ;;
    overhead)  # host time of each layer of one optimized call (benchmarks/cuda_overhead.py)
      python3 benchmarks/cuda_overhead.py --profile --json "$OUT/overhead.json" 2>&1 | grep -v Warning > "$OUT/overhead.txt"
      head -14 "$OUT/overhead.txt" | tail -12 ;;
    bandwidth)  # DRAM bandwidth of the memory-bound kernels against a copy (benchmarks/cuda_bandwidth.py)
      python3 benchmarks/cuda_bandwidth.py --mb ${BW_MB:-512} --problems "$PROBLEMS" --json "$OUT/bandwidth.json" ${BW_ONLY:+--only $BW_ONLY} ${BW_ARGS:-} 2>&1 \
        | grep -v Warning | tee "$OUT/bandwidth.txt" ;;
    gap)  # installed torch.compile vs whole-model compile vs CUDA graph (benchmarks/compile_gap.py)
      python3 benchmarks/compile_gap.py --problems "$PROBLEMS" --level ${GAP_LEVEL:-2} --ids ${GAP_IDS:-25 32 44 49} \
        --json "$OUT/gap.json" 2>&1 | grep -v Warning | tee "$OUT/gap.txt" | grep -E "^L[0-9]|Error" ;;
    kgap)  # a kernel candidate's GPU time against its host time, plain and replayed as a CUDA graph (benchmarks/kernel_gap.py)
      python3 benchmarks/kernel_gap.py --problems "$PROBLEMS" --level ${GAP_LEVEL:-2} --ids ${GAP_IDS:-31 32} \
        --json "$OUT/kgap.json" 2>&1 | grep -v Warning | tee "$OUT/kgap.txt" | grep -E "^L[0-9]|Error" ;;
    sweep)  # every candidate through the pipeline at small sizes, no torch.compile: finds the broken ones fast
      METAL_ACCEL_USER_CACHE=$(mktemp -d) metal-accel bench "$PROBLEMS" --provider dir:benchmarks/candidates --attempted-only \
        --max-tensor-mb ${SWEEP_MB:-32} --no-compile --budget 0.3 --bench-budget 0.3 --timeout 40 --out "$OUT/sweep" \
        --no-progress ${SWEEP_ARGS:-} 2>&1 | grep -v Warning | tee /tmp/sweep.log | grep -E "^L[0-9]|level" ;;
    blocks)
      python3 scripts/build_shipped_cache.py --backend cuda --report "$OUT/blocks.json" > /tmp/blocks.log 2>&1
      tail -2 /tmp/blocks.log
      tar cf "$OUT/kernels_cache_cuda.tar" metal_accel/kernels_cache/cuda ;;
    bench)
      LEFT=$(( ${DEADLINE:-570} - ($(date +%s) - START) ))
      METAL_ACCEL_USER_CACHE=$(mktemp -d) timeout -s INT -k 20 $LEFT metal-accel bench "$PROBLEMS" \
        --provider dir:benchmarks/candidates ${ATTEMPTED---attempted-only} --max-tensor-mb ${BENCH_MB:-64} --budget ${BENCH_BUDGET:-0.6} \
        --bench-budget ${BENCH_BUDGET:-0.6} --compile-jobs ${COMPILE_JOBS:-12} --out "$OUT/bench" --no-progress \
        ${BENCH_ARGS:-} 2>&1 | grep -v Warning | tee /tmp/bench.log | grep -E "^L[0-9]|level" ;;
    zoo)  # the model zoo (benchmarks/models.py) on the GPU; needs .whl-bench/ carried (transformers, timm, torchvision)
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl-bench/*.whl 2>&1 | tail -2
      export PYTHONPATH=/tmp/site
      LEFT=$(( ${DEADLINE:-570} - ($(date +%s) - START) ))
      HF_HUB_OFFLINE=1 timeout -s INT -k 20 $LEFT python3 benchmarks/models.py --device cuda --dtype ${ZOO_DTYPES:-fp32,bf16} \
        --models ${ZOO_MODELS:-llama,bert} --model-timeout ${ZOO_TIMEOUT:-240} --out "$OUT" ${ZOO_ARGS:-} 2>&1 \
        | grep -v Warning | tee /tmp/zoo.log | tail -${ZOO_TAIL:-30}
      mkdir -p "$OUT/zoo_logs"; cp /tmp/ma_zoo_logs_*/*.log "$OUT/zoo_logs/" 2>/dev/null ;;
    synth)  # synthesis end to end against the scripted server (benchmarks/synth_e2e.py); needs .whl-llm/ (the SDKs)
      # and .kb/ carried, and .whl-ray/ (Ray 2.40 for Python 3.12: its wheels and the package as a tarball) for --ray-gpus
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl-llm/*.whl 2>&1 | tail -2
      if [ -d .whl-ray ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
          $(ls .whl-ray/*.whl | grep -v -e /idna- -e /typing_extensions-) 2>&1 | tail -2
        tar xJf .whl-ray/ray-cp312.tar.xz -C /tmp/site
      fi
      export PYTHONPATH=/tmp/site
      LEFT=$(( ${DEADLINE:-570} - ($(date +%s) - START) )); touch /tmp/synth.start
      KB_PROBLEMS=$PROBLEMS timeout -s INT -k 20 $LEFT python3 benchmarks/synth_e2e.py --kernelbench --backend cuda \
        --max-tensor-mb 64 --answer-s 60 --time-scale 0.02 --rows-out /tmp/synth_rows ${SYNTH_ARGS:---no-farm --limit 70 --max-wall 420} 2>&1 \
        | grep -v Warning | tee /tmp/synth.log | tail -${SYNTH_TAIL:-25}
      find docs/results/synth_e2e -name '*.json' -newer /tmp/synth.start | xargs -r cp -t "$OUT/"
      cp /tmp/synth.log "$OUT/"; cp /tmp/synth_rows.*.jsonl "$OUT/" 2>/dev/null
      tail -n 30 /tmp/ray/session_latest/logs/worker-*.err 2>/dev/null | grep -v "^$" | tail -n 200 > "$OUT/ray_workers.txt" ;;
    cpu)
      mkdir -p "$OUT/cpu"
      { lscpu; free -g; gcc --version | head -1; } > "$OUT/cpu/machine.txt" 2>&1
      for key in ${CPU_KEYS:?}; do
        LEFT=$(( ${DEADLINE:-570} - ($(date +%s) - START) ))
        [ $LEFT -gt 60 ] || { echo "$key: not started, ${LEFT}s left"; continue; }
        METAL_ACCEL_USER_CACHE=$(mktemp -d) CUDA_VISIBLE_DEVICES= timeout -s INT -k 20 $LEFT metal-accel -vv bench \
          "$PROBLEMS" --backend cpu --provider dir:benchmarks/candidates --problems "$key" --max-tensor-mb ${CPU_MB:-9000} \
          --compile-candidate --budget 0.5 --bench-budget 0.5 --no-progress --out "$OUT/cpu/$key" 2>&1 \
          | grep --line-buffered -v Warning > "$OUT/cpu/$key.log"
        echo "$key rc=$? $(grep -E "^L[0-9]" "$OUT/cpu/$key.log" | head -1)"
      done ;;
  esac
done
