#!/usr/bin/env bash
# One GPU session of benchmarks/README.md: install the carried wheels, build the Nano checkpoint,
# run hf_gpu.py (fast paths against stock) and serve_gpu.py (the whole server over HTTP).
#
#   bash benchmarks/run_gpu.sh RESULTS_DIR [PLACEMENT]     # PLACEMENT: one-gpu (default), two-gpu
#
# It copies the repository to RESULTS_DIR/repo first and runs from there, so the working tree
# may be refreshed meanwhile; it touches RESULTS_DIR/DONE at the end. Wheels: what
# `benchmarks/gpu_wheels.py --dest .whl` put there (.whl/*.whl, and .whl/*.tar.xz: the contents of
# wheels too large for the transfer limit, xz-compressed).
# SKIP_WHEELS=1, SHAPE=micro, PY=python and EXTRA="--quick" run the same steps on a CPU.
# BASELINE=DIR (a checkout of an older commit, its path absolute) first serves that checkout with
# the same serve_gpu.py (steps BASELINE_STEPS, default interleaved_first,video) for a side-by-side
# comparison; ONLY=steps limits this checkout's run; SKIP_HF=1 skips hf_gpu.py.
set -u
R=${1:-/tmp/omni}
P=${2:-one-gpu}
SHAPE=${SHAPE:-nano}
PY=${PY:-python3}
CKPT=${CKPT:-/tmp/$SHAPE}
mkdir -p "$R"
rm -rf "$R/repo" && mkdir -p "$R/repo"
cp -r sglang_omni benchmarks pyproject.toml "$R/repo/"
if [ "${SKIP_WHEELS:-0}" != 1 ]; then
  t0=$(date +%s)
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl || exit 1
  for t in .whl/*.tar.xz; do tar xJf "$t" -C /tmp/site || exit 1; done
  export PYTHONPATH=/tmp/site
  echo "wheels installed in $(( $(date +%s) - t0 )) s"
fi
cd "$R/repo" || exit 1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
$PY -c "import torch, transformers, diffusers, av, fastapi, uvicorn, pydantic, llguidance
print('torch', torch.__version__, 'transformers', transformers.__version__, 'diffusers',
      diffusers.__version__, 'gpus', torch.cuda.device_count())" || exit 1
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv 2>/dev/null
if [ ! -f "$CKPT/model_index.json" ]; then
  t0=$(date +%s)
  $PY -m sglang_omni make-checkpoint --shape "$SHAPE" "$CKPT" > "$R/checkpoint.log" 2>&1
  rc=$?
  echo "checkpoint built in $(( $(date +%s) - t0 )) s (exit $rc)" | tee -a "$R/checkpoint.log"
  du -sh "$CKPT" | tee -a "$R/checkpoint.log"
fi
df -h "$CKPT" | tail -1
if [ "${SKIP_HF:-0}" != 1 ]; then
  echo "hf_gpu.py started $(date +%T)"
  $PY -W ignore benchmarks/hf_gpu.py --checkpoint "$CKPT" ${HF_EXTRA:-} \
      --out "$R/hf_gpu_$SHAPE.json" > "$R/hf_gpu.log" 2>&1
  rc=$?
  echo "hf_gpu.py ended $(date +%T) (exit $rc)"
fi
if [ -n "${BASELINE:-}" ]; then  # an older checkout, served by this serve_gpu.py, side by side
  echo "serve_gpu.py (baseline $BASELINE) started $(date +%T)"
  $PY -W ignore benchmarks/serve_gpu.py --placement "$P" --shape "$SHAPE" --checkpoint "$CKPT" \
      --serve-from "$BASELINE" --only "${BASELINE_STEPS:-interleaved_first,video}" ${EXTRA:-} \
      --out "$R/serve_${P}_baseline.json" --log "$R/server_${P}_baseline.log" \
      > "$R/serve_baseline.log" 2>&1
  echo "serve_gpu.py (baseline) ended $(date +%T) (exit $?)"
fi
echo "serve_gpu.py started $(date +%T)"
$PY -W ignore benchmarks/serve_gpu.py --placement "$P" --shape "$SHAPE" --checkpoint "$CKPT" \
    ${ONLY:+--only "$ONLY"} ${EXTRA:-} --out "$R/serve_$P.json" --log "$R/server_$P.log" > "$R/serve.log" 2>&1
rc=$?
echo "serve_gpu.py ended $(date +%T) (exit $rc)"
touch "$R/DONE"
