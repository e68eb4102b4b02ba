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
# ONLY may name the step `load` (alone or beside serve_gpu.py's steps): benchmarks/load_gpu.py,
# N README requests at once (EXTRA too, and LOAD_EXTRA: its own flags, e.g. "--ns 1,4
# --deadline-s 0"),
# the BASELINE checkout's first when BASELINE is set, then this one's, and plot_load.py's SVG:
# load_$P.json, load_${P}_baseline.json, load_$P.svg.
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
  # bytecode now, as a plain pip install does: else the first server's start compiles every
  # module of transformers and diffusers it imports, and start-up measures the compiler
  $PY -m compileall -q -j 0 /tmp/site > /dev/null 2>&1
  export PYTHONPATH=/tmp/site
  echo "wheels installed and compiled in $(( $(date +%s) - t0 )) s"
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
LOAD=0
SERVE_ONLY=${ONLY:-}
case ",${ONLY:-}," in
  *,load,*) LOAD=1; SERVE_ONLY=$(echo ",$ONLY," | sed 's/,load,/,/; s/^,//; s/,$//') ;;
esac
SERVE=1
if [ -n "${ONLY:-}" ] && [ -z "$SERVE_ONLY" ]; then SERVE=0; fi  # ONLY=load: no serve_gpu.py
if [ "$LOAD" = 1 ]; then  # many requests at once: the baseline's, then this checkout's
  if [ -n "${BASELINE:-}" ]; then
    echo "load_gpu.py (baseline $BASELINE) started $(date +%T)"
    $PY -W ignore benchmarks/load_gpu.py --placement "$P" --checkpoint "$CKPT" \
        --serve-from "$BASELINE" ${EXTRA:-} ${LOAD_EXTRA:-} --out "$R/load_${P}_baseline.json" \
        --log "$R/server_load_${P}_baseline.log" > "$R/load_baseline.log" 2>&1
    echo "load_gpu.py (baseline) ended $(date +%T) (exit $?)"
  fi
  echo "load_gpu.py started $(date +%T)"
  $PY -W ignore benchmarks/load_gpu.py --placement "$P" --checkpoint "$CKPT" ${EXTRA:-} \
      ${LOAD_EXTRA:-} --out "$R/load_$P.json" --log "$R/server_load_$P.log" > "$R/load.log" 2>&1
  echo "load_gpu.py ended $(date +%T) (exit $?)"
  old_json="$R/load_${P}_baseline.json"
  [ -f "$old_json" ] || old_json=""
  [ -f "$R/load_$P.json" ] && $PY benchmarks/plot_load.py --new "$R/load_$P.json" \
      ${old_json:+--old "$old_json"} --out "$R/load_$P.svg"
fi
if [ "$SERVE" = 1 ] && [ -n "${BASELINE:-}" ]; then  # an older checkout, served by this serve_gpu.py, side by side
  echo "serve_gpu.py (baseline $BASELINE) started $(date +%T)"
  $PY -W ignore benchmarks/serve_gpu.py --placement "$P" --shape "$SHAPE" --checkpoint "$CKPT" \
      --serve-from "$BASELINE" --only "${BASELINE_STEPS:-interleaved_first,video}" ${EXTRA:-} \
      --out "$R/serve_${P}_baseline.json" --log "$R/server_${P}_baseline.log" \
      > "$R/serve_baseline.log" 2>&1
  echo "serve_gpu.py (baseline) ended $(date +%T) (exit $?)"
fi
if [ "$SERVE" = 1 ]; then
  echo "serve_gpu.py started $(date +%T)"
  $PY -W ignore benchmarks/serve_gpu.py --placement "$P" --shape "$SHAPE" --checkpoint "$CKPT" \
      ${SERVE_ONLY:+--only "$SERVE_ONLY"} ${EXTRA:-} --out "$R/serve_$P.json" --log "$R/server_$P.log" > "$R/serve.log" 2>&1
  rc=$?
  echo "serve_gpu.py ended $(date +%T) (exit $rc)"
fi
touch "$R/DONE"
