#!/bin/bash
# On a GPU machine (run from the repository root, with .dev/site.tgz from benchmarks/gpu_site.sh
# carried along): the CUDA tests, then PPO's graphed numbers, then the GPU check, each cut off
# at its share of BUDGET seconds (default 540); reports land in $OUT (or /tmp/gpu-out).
S=$(date +%s); OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
left() { echo $(( ${BUDGET:-540} - ($(date +%s) - S) )); }
mkdir -p /tmp/site && tar xzf .dev/site.tgz -C /tmp/site || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/machine.txt"
timeout 200 python3 -m pytest -p no:cacheprovider -n 4 -q -rA tests/test_cudagraphs.py -k on_cuda > "$OUT/pytest_cuda.log" 2>&1
grep -E "^(PASSED|FAILED)|passed|failed" "$OUT/pytest_cuda.log"
timeout $(( $(left) / 2 )) python3 benchmarks/gpu_graphs.py --n 20 --steps 150000 --out "$OUT/gpu_graphs.md" > "$OUT/gpu_graphs.log" 2>&1
grep "^|" "$OUT/gpu_graphs.log" | head -12
[ "$(left)" -gt 30 ] && timeout "$(left)" python3 benchmarks/gpu_check.py --out "$OUT/gpu_check.md" > "$OUT/gpu_check.log" 2>&1
grep "^|\|FAILED" "$OUT/gpu_check.log" | tail -20
