#!/usr/bin/env bash
# Set up .venv, record a real 4-process DDP training run on CPU (gloo) with one slow rank, show
# the trace and what dtprof analyze finds in it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
TRACE=${TRACE:-runs/demo}
rm -rf "$TRACE"
echo "== recording: torchrun --nproc-per-node 4 examples/train_ddp.py --trace $TRACE"
OMP_NUM_THREADS=1 torchrun --nproc-per-node 4 --master-port "${MASTER_PORT:-29517}" \
  examples/train_ddp.py --trace "$TRACE" --steps "${STEPS:-60}" --slow-rank 2
echo "== what was recorded: dtprof info $TRACE"
dtprof info "$TRACE"
echo
echo "== what went wrong: dtprof analyze $TRACE"
dtprof analyze "$TRACE" || true   # exits 1 when it finds an error, as CI would want
echo
echo "The trace is Parquet: python -c \"import dtprof; t = dtprof.load_trace('$TRACE'); print(t.collectives)\""
echo "The dashboard: . .venv/bin/activate && dtprof dashboard $TRACE   (then open http://127.0.0.1:8050/)"
echo "               dtprof replay $TRACE --speed 2                   (the run played as if live)"
