#!/usr/bin/env bash
# dtprof's GPU check, for a machine with one NVIDIA GPU: benchmarks/gpu_check.py's five parts
# (NCCL world of one, two processes sharing the GPU over gloo, the overhead ratio, analyze,
# CUDA graph captures and a later attach), in about four minutes.
#
#   bash benchmarks/gpu_check.sh [OUT [OPTIONS]]
#
# OUT: where the results go (default $OUT or /tmp/gpu_check_out); OPTIONS go to gpu_check.py
# (--parts 3,5, --gpu-modes bare,dtprof, --cases ..., to run a part of it again).
#
# It uses the machine's own python3, which must have torch with CUDA, numpy, pandas, pyarrow and
# nvidia-ml-py. dtprof's other needs (msgspec, orjson) are installed from wheels in .whl/ where
# that folder is there (docs/gpu.md says how to fetch them), and dtprof runs from this checkout;
# the native bucket kernel is built first. The results: gpu_check.json, gpu_check.txt, the two
# reports, log.txt and traces.tar.gz.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-/tmp/gpu_check_out}}
shift || true
work=/tmp/dtprof_gpu_check
mkdir -p "$out"
rm -rf "$work"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/dtprof_site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/dtprof_site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw \
  --format=csv 2>&1 | tee "$out/log.txt"
# the native recording kernel, built against this torch (the overhead's modes use it)
timeout 120 python3 -m dtprof build-native 2>&1 | tail -3 | tee -a "$out/log.txt"
timeout 500 python3 benchmarks/gpu_check.py --out "$out" --work "$work" "$@" 2>&1 |
  tee -a "$out/log.txt"
status=${PIPESTATUS[0]}
traces=$(cd "$work" && ls -d trace_nccl trace_gloo 2>/dev/null)
[ -n "$traces" ] && tar czf "$out/traces.tar.gz" -C "$work" $traces 2>>"$out/log.txt"
exit "$status"
