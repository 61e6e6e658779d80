#!/usr/bin/env bash
# Every GPU measurement of docs/benchmarks.md §6 in one call, on a machine with a CUDA device:
#   bash bench/gpu_session.sh [OUT.jsonl]        (or: make bench-gpu)
#   on a machine without a package index: here `bash bench/gpu_wheels.sh .whl`, carry .whl there, then
#   WHEELS=.whl PYTHON=python3 bash bench/gpu_session.sh  (installed into WHEELS_SITE, default /tmp/fedmedbench-site)
#   STEPS='cuda|engine' bash bench/gpu_session.sh  runs only the steps whose names match the
#   extended regular expression (case-insensitive): the session in parts, e.g. where one command may
#   run only so long (the PathMNIST grid cost trains 3 epochs of the training centre's share of PathMNIST's
#   89,996-image training split per method; each surgical grid step takes minutes: STEPS=fedst, STEPS=ultraflwr).
#   A STEPS that is no valid pattern, or matches no step, exits 2.
#   STEP_LIMIT=S stops a step after S seconds; BUDGET=S stops the session after S seconds: a step runs at most
#   what is left and none starts with under 30 s left (a GPU allocation of so many minutes).
#   The paper grids on today's code in about 12 minutes of an H200 (docs/compute.md): the "grid:" steps, which run
#   only when STEPS names them (a pattern with "grid:" in it):
#     BUDGET=720 STEPS='^grid:' bash bench/gpu_session.sh
#   each grid timed whole (every method of earlystop and gpaf, both earlystop datasets and its quantity-skewed
#   settings; fedst's FedST with its evaluating round and FedAvg; ultraflwr's FedAvg, its strategies costed at that
#   rate), earlystop's clients together against one at a time, against one call a step, and its seeds side by side,
#   and fedst's and ultraflwr's
#   jobs sharing a GPU; summary rows to bench/grid_cost_results.jsonl (GRID_RESULTS), which takes rows of committed
#   code only (ALLOW_DIRTY=1: marked rows of a changed tree).
# Each step appends its JSON rows to OUT (default bench/gpu_results.jsonl) and its output to
# OUT's folder/gpu_session.log (the engine's torch.profiler tables to engine_torch_profile.txt
# there). A step that fails does not stop the others; the summary at the end lists each step's
# status and seconds, and the exit status is 1 when a step failed.
# The surgical grids are timed on synthetic stand-ins at the papers' frame counts, built in the background
# from the start into $STAND_IN (default /tmp/fedmedbench-stand-in; bench/surgical_stand_in.py), or on the
# real videos' exports in $SURGICAL_DIR when set (resources/surgical/real after Snakemake built them).
# The timings log each round and local epoch with the clock: a step cut short still shows how far it got.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && PY=.venv/bin/python
OUT=${1:-bench/gpu_results.jsonl}
LOG=$(dirname "$OUT")/gpu_session.log
THREADS=${THREADS:-4}
STAND_IN=${STAND_IN:-/tmp/fedmedbench-stand-in}
export PYTHONUNBUFFERED=1
# every step imports this tree's package (an installed fedmedbench, or none, would run other code or fail)
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"

if [ -n "${STEPS:-}" ]; then  # a bad pattern or a typo would otherwise run nothing and end "successfully"
  grep -qiE -- "$STEPS" <<<"" 2>/dev/null
  if [ $? -eq 2 ]; then echo "gpu_session: STEPS='$STEPS' is not an extended regular expression" >&2; exit 2; fi
fi
if [ -n "${FMB_TREE:-}" ] && ! [[ "$FMB_TREE" =~ ^[0-9a-fA-F]{4,40}(:clean)?$ ]]; then  # the form of _report.TREE_FORMAT
  echo "gpu_session: FMB_TREE=$FMB_TREE: give COMMIT or COMMIT:clean (COMMIT: 4-40 hex digits)" >&2; exit 2
fi
if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "gpu_session: torch in $PY sees no CUDA device; run this on a GPU machine with a CUDA build of torch" >&2
  exit 2
fi
if [ -n "${WHEELS:-}" ]; then  # an offline GPU machine: the wheels bench/gpu_wheels.sh downloaded, carried there
  if ! compgen -G "$WHEELS/*.whl" >/dev/null; then
    echo "gpu_session: WHEELS=$WHEELS holds no .whl file (bash bench/gpu_wheels.sh $WHEELS downloads them)" >&2; exit 2
  fi
  SITE=${WHEELS_SITE:-/tmp/fedmedbench-site}
  if ! "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHEELS"/*.whl; then
    echo "gpu_session: pip could not install the wheels of $WHEELS into $SITE" >&2; exit 2
  fi
  export PYTHONPATH="$PWD/src:$SITE${PYTHONPATH#"$PWD/src"}"  # this tree's package first, then the wheels
fi
missing=$("$PY" -c '
import importlib.util
need = ["flwr", "flwr_datasets", "jsonschema", "timm", "medmnist", "sklearn", "pandas", "yaml", "psutil",
        "ultralytics", "thop", "cv2", "pyarrow", "medpy", "PIL", "matplotlib", "cryptography", "httpx"]
print(" ".join(m for m in need if importlib.util.find_spec(m) is None))')
if [ -n "$missing" ]; then  # every step would fail on its first import
  echo "gpu_session: $PY lacks: $missing (offline: bench/gpu_wheels.sh DIR downloads their wheels elsewhere; WHEELS=DIR here installs them)" >&2
  exit 2
fi
mkdir -p "$(dirname "$OUT")"
{ date -u; git rev-parse HEAD 2>/dev/null; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'; } | tee -a "$LOG"

summary=()
hard_failures=0
selected() { [ -z "${STEPS:-}" ] || grep -qiE -- "$STEPS" <<<"$1"; }
# a "grid:" step: only where STEPS has "grid:" in it and matches the step's name (not part of the whole session)
grid_selected() { [[ "${STEPS:-}" == *grid:* ]] && selected "$1"; }
step() {  # step NAME COMMAND...: under STEP_LIMIT and what is left of BUDGET
  local name=$1; shift
  selected "$name" || return 0
  local limit=${STEP_LIMIT:-0}
  if [ -n "${BUDGET:-}" ]; then
    local left=$((BUDGET - SECONDS))
    if [ "$left" -lt 30 ]; then
      echo "== $name: skipped, ${left} s of BUDGET left" | tee -a "$LOG"
      summary+=("$(printf '%-28s %6ss  %s' "$name" 0 "skipped (BUDGET spent)")")
      return 0
    fi
    if [ "$limit" -le 0 ] || [ "$limit" -gt "$left" ]; then limit=$left; fi
  fi
  echo "== $name: $*" | tee -a "$LOG"
  local t0=$SECONDS
  if [ "$limit" -gt 0 ]; then timeout -k 5 "$limit" "$@"; else "$@"; fi 2>&1 | tee -a "$LOG" | tail -n 5
  local rc=${PIPESTATUS[0]} status=ok
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    status="TIMED OUT (limit $limit s; its output so far is in the log)"; hard_failures=$((hard_failures + 1))
  elif [ "$rc" -ne 0 ]; then status="FAILED (rc $rc)"; hard_failures=$((hard_failures + 1)); fi
  summary+=("$(printf '%-28s %6ss  %s' "$name" $((SECONDS - t0)) "$status")")
}
grid_step() { grid_selected "$1" || return 0; step "$@"; }
# The stand-ins are CPU work (one dataset per process; fedst's with every training frame took 5.5 min on the
# H100 machine, most of it decoding every frame to index it): each is built in the background from the start, while the GPU steps before its own
# run, and its step waits for it. The builds use up to 7 + 2 of the 16 cores meanwhile.
start_build() {  # start_build NAME STUDY ARGS...: the stand-in of config/studies/STUDY.yaml in NAME; its exit status in NAME.rc
  local name=$1 study=$2; shift 2
  mkdir -p "$STAND_IN" && rm -f "$STAND_IN/$name.rc"
  ( "$PY" bench/surgical_stand_in.py --config "config/studies/$study.yaml" --out "$STAND_IN/$name" "$@" \
      >"$STAND_IN/$name.log" 2>&1; echo $? >"$STAND_IN/$name.rc" ) &
}
# a stand-in step: the build's output and exit status once it is done (a command, so that a limit can stop it)
WAIT_BUILD='while [ ! -s "$0/$1.rc" ]; do sleep 2; done; cat "$0/$1.log"; exit "$(cat "$0/$1.rc")"'
if [ -z "${SURGICAL_DIR:-}" ]; then
  # fedst: a quarter of the training frames (the clip cache is scaled with them: the same share of the clips the
  # steps draw from) and a tenth of the test frames (an evaluation is scaled back up); ultraflwr: 2 % of every
  # video's frames (a round is scaled up to all of them)
  # (FEDST_FRACTION, FEDST_TEST_FRACTION and ULTRAFLWR_FRACTION set other shares: a smaller one builds sooner, where a
  # session has minutes; fedst's clip cache is scaled with it, so a step still hits the cache as often)
  if selected "fedst stand-in"; then
    start_build fedst fedst --fraction "${FEDST_FRACTION:-0.25}" --test-fraction "${FEDST_TEST_FRACTION:-0.1}" --jobs 8
  fi
  if selected "ultraflwr stand-in"; then start_build ultraflwr ultraflwr --fraction "${ULTRAFLWR_FRACTION:-0.02}" --jobs 8; fi
  # the grid steps' own: fedst's a tenth of the training frames and 5 % of the test frames (built in 68 s on the
  # H200's machine at f9cec13), ultraflwr's 2 %
  if grid_selected "grid: fedst"; then
    start_build grid-fedst fedst --fraction "${FEDST_FRACTION:-0.1}" --test-fraction "${FEDST_TEST_FRACTION:-0.05}" --jobs 8
  fi
  if grid_selected "grid: ultraflwr"; then start_build grid-ultraflwr ultraflwr --fraction "${ULTRAFLWR_FRACTION:-0.02}" --jobs 8; fi
fi

# --- the paper grids on today's code (about 12 minutes of an H200; see the header) ----------------------------------
GRID_RESULTS=${GRID_RESULTS:-bench/grid_cost_results.jsonl}
GRID_FLAGS=(--threads "$THREADS" --out "$OUT" --results "$GRID_RESULTS")
[ "${ALLOW_DIRTY:-0}" = 1 ] && GRID_FLAGS+=(--allow-dirty)
GRID_UF="${SURGICAL_DIR:-$STAND_IN/grid-ultraflwr}"
GRID_FST="${SURGICAL_DIR:-$STAND_IN/grid-fedst}"
# earlystop, the config's clients together: all ten methods on DermaMNIST dir0.01, FedAvg on BloodMNIST dir0.01 and on
# the three quantity-skewed settings (their rounds take other steps); each job costed at its method's and pair's rate
STEP_LIMIT=210 grid_step "grid: earlystop, clients together" "$PY" bench/grid_cost.py --config config/studies/earlystop.yaml \
  --rounds 3 --batch-clients --scale-by dermamnist/qty0.01 dermamnist/qty0.1 dermamnist/qty1.0 "${GRID_FLAGS[@]}"
# train.batch_clients decided by measurement: FedAvg one client at a time on dir0.01 (both datasets) and qty0.01 / 1.0
STEP_LIMIT=70 grid_step "grid: earlystop, one client at a time" "$PY" bench/grid_cost.py \
  --config config/studies/earlystop.yaml --rounds 3 --no-batch-clients --methods fedavg \
  --scale-by dermamnist/qty0.01 dermamnist/qty1.0 "${GRID_FLAGS[@]}"
# the grouped calls decided by measurement: FedAvg together, one call a step (every client padded to the largest
# batch, as before) on the same pairs: the quantity-skewed rounds compute 2-3x the samples in fewer calls
STEP_LIMIT=50 grid_step "grid: earlystop, one call a step" "$PY" bench/grid_cost.py \
  --config config/studies/earlystop.yaml --rounds 3 --batch-clients --batch-padding inf --methods fedavg \
  --scale-by dermamnist/qty0.01 dermamnist/qty1.0 "${GRID_FLAGS[@]}"
# train.seeds_together decided by measurement: three seeds side by side, FedAvg and FedSMOO (launch- and compute-heavy)
STEP_LIMIT=90 grid_step "grid: earlystop, seeds side by side" "$PY" bench/grid_cost.py \
  --config config/studies/earlystop.yaml --rounds 3 --batch-clients --runs-together 3 --methods fedavg fedsmoo \
  "${GRID_FLAGS[@]}"
# fedst: FedST (its evaluating third round on 5 % of the test frames, scaled up) and FedAvg, 20 of the 100 local steps a
# round (and of FedST's server steps), scaled back; the other six methods at their mean
if [ -z "${SURGICAL_DIR:-}" ]; then grid_step "grid: fedst data" bash -c "$WAIT_BUILD" "$STAND_IN" grid-fedst; fi
STEP_LIMIT=150 grid_step "grid: fedst" "$PY" bench/grid_cost.py --config config/studies/fedst.yaml --rounds 3 \
  --surgical-steps 20 --surgical-dir "$GRID_FST" --methods fedst seg_fedavg "${GRID_FLAGS[@]}"
# fedst jobs sharing the GPU, FedST's (its server steps too): throughput and peak memory (fedst.resources.gpu_mem_mb)
STEP_LIMIT=80 grid_step "grid: fedst jobs per GPU" "$PY" bench/gpu_packing.py --config config/studies/fedst.yaml \
  --study fedst --method fedst --surgical-dir "$GRID_FST" --surgical-steps 20 --jobs 1 4 --rounds 2 --threads 2 --out "$OUT"
# ultraflwr: FedAvg on each group's first setting (the config's loading: frame store, read ahead), 2 local epochs a
# round scaled to 20; the strategies differ in which tensors are averaged and are costed at its rate
if [ -z "${SURGICAL_DIR:-}" ]; then grid_step "grid: ultraflwr data" bash -c "$WAIT_BUILD" "$STAND_IN" grid-ultraflwr; fi
STEP_LIMIT=90 grid_step "grid: ultraflwr" "$PY" bench/grid_cost.py --config config/studies/ultraflwr.yaml --rounds 3 \
  --surgical-epochs 2 --surgical-dir "$GRID_UF" --methods FedAvg --image-cache "$STAND_IN/grid-frames" "${GRID_FLAGS[@]}"
STEP_LIMIT=80 grid_step "grid: ultraflwr jobs per GPU" "$PY" bench/gpu_packing.py --config config/studies/ultraflwr.yaml \
  --study ultraflwr --surgical-dir "$GRID_UF" --method FedAvg --jobs 1 4 --rounds 2 --threads 2 \
  --image-cache "$STAND_IN/grid-frames" --out "$OUT"
# gpaf, BreastMNIST (Scenario 1): its five methods, 2 rounds each
STEP_LIMIT=100 grid_step "grid: gpaf" "$PY" bench/grid_cost.py --config config/studies/gpaf.yaml --study gpaf --rounds 2 \
  "${GRID_FLAGS[@]}"
# gpaf on PathMNIST (Scenario 2): one round of each method, the training centre's 90k images; past the 12 minutes, it
# runs where BUDGET leaves time (a session of its own: BUDGET=600 STEPS='grid: gpaf pathmnist')
grid_step "grid: gpaf pathmnist" "$PY" bench/grid_cost.py --config config/studies/gpaf.yaml --study gpaf_pathmnist \
  --rounds 1 "${GRID_FLAGS[@]}"

step "cuda tests" "$PY" -m pytest -q -p no:cacheprovider tests/test_cuda.py tests/test_device_arrays.py
# fedst's frame scoring (eval.metrics_device): MedPy/SciPy on the CPU against torch on the GPU, ms per 480x480
# 4-class frame, on predictions near the ground truth and on scattered ones (a tenth of the pixels relabelled)
step "segmetrics on the device" "$PY" bench/segmetrics_device.py --device cuda --frames 64 --numpy-frames 16 --out "$OUT"
step "segmetrics on the device, noisy predictions" "$PY" bench/segmetrics_device.py --device cuda --frames 64 \
  --numpy-frames 16 --noise 0.1 --out "$OUT"
step "engine vs resident loop" "$PY" bench/engine_overhead.py --device cuda \
  --study-config config/studies/earlystop.yaml --rounds 5 --eval-every 1 --repeats 2 --threads "$THREADS" --resident \
  --torch-profile "$(dirname "$OUT")/engine_torch_profile.txt" --out "$OUT"
# the same with every side's local steps waiting for the GPU each step, as before (CPU batch indices into the
# cached data): what queuing the next step while the GPU runs this one saves, on this machine
step "engine vs resident loop, steps waiting" "$PY" bench/engine_overhead.py --device cuda \
  --study-config config/studies/earlystop.yaml --rounds 5 --eval-every 1 --repeats 2 --threads "$THREADS" --resident \
  --waiting-steps --out "$OUT"
# the seconds per round each side spends outside local training and evaluation, and its kernel launches there
step "engine host overhead" "$PY" bench/host_overhead.py --device cuda --width 0 --rounds 6 --repeats 2 \
  --threads "$THREADS" --out "$OUT"
# the same with each checkpoint written in the round: what the background writer saves (or costs, in GIL time)
step "engine host overhead, checkpoint in the round" "$PY" bench/host_overhead.py --device cuda --width 0 --rounds 6 \
  --repeats 2 --threads "$THREADS" --checkpoint-writes in-round --out "$OUT"
# the same with deterministic kernels (engine.deterministic): what a reproducible GPU run costs
step "engine, deterministic kernels" "$PY" bench/engine_overhead.py --device cuda \
  --study-config config/studies/earlystop.yaml --rounds 5 --eval-every 1 --repeats 2 --threads "$THREADS" --resident \
  --deterministic --out "$OUT"
step "engine, batch 50" "$PY" bench/engine_overhead.py --device cuda --model timm:convnextv2_nano \
  --rounds 3 --eval-every 1 --repeats 1 --threads "$THREADS" --resident --out "$OUT"
step "scaffold round persistence" "$PY" bench/round_persistence.py --method scaffold --rounds 6 \
  --threads "$THREADS" --device cuda --out "$OUT"
# one client after another, then each round's clients together (train.batch_clients, on in the paper config)
step "earlystop grid cost" "$PY" bench/grid_cost.py --config config/studies/earlystop.yaml --rounds 3 \
  --methods fedavg fedprox scaffold feddyn fedsam fedspeed fedsmoo fedgamma fedlesam fedwmsam --no-batch-clients \
  --threads "$THREADS" --out "$OUT"
# (with FedAvg also on BloodMNIST and on quantity skew: each job costed at its dataset's and setting's rate)
step "earlystop grid cost, clients together" "$PY" bench/grid_cost.py --config config/studies/earlystop.yaml --rounds 3 \
  --methods fedavg fedprox scaffold feddyn fedsam fedspeed fedsmoo fedgamma fedlesam fedwmsam --batch-clients \
  --scale-by bloodmnist/dir0.01 dermamnist/qty0.01 dermamnist/qty1.0 bloodmnist/qty1.0 --threads "$THREADS" --out "$OUT"
# quantity skew (one client holding most of DermaMNIST) one client at a time; together it is a --scale-by pair above
step "earlystop quantity skew, one by one" "$PY" bench/grid_cost.py --config config/studies/earlystop.yaml \
  --rounds 3 --setting qty0.01 --methods fedavg --no-batch-clients --threads "$THREADS" --out "$OUT"
# the same in bfloat16 autocast (train.autocast: bf16, an option: results change): whether the batched steps'
# bigger kernels gain from it, where one client's launch-bound steps did not
step "earlystop clients together, bf16" "$PY" bench/grid_cost.py --config config/studies/earlystop.yaml \
  --rounds 3 --methods fedavg fedsmoo --batch-clients --autocast bf16 --threads "$THREADS" --out "$OUT"
# where a batched round's time goes: torch.profiler's ops by host and by device time
step "earlystop round profile, clients together" "$PY" bench/grid_cost.py --config config/studies/earlystop.yaml \
  --rounds 2 --methods fedavg --batch-clients --threads "$THREADS" \
  --torch-profile "$(dirname "$OUT")/earlystop_together_profile.txt" --out "$OUT"
# three seeds of a method side by side in one process (fl/engine/runs_together.py): one batched call of their 30 clients a
# round; a job's seconds a round are its third of the wall time (against "clients together" above, one job alone)
step "earlystop seeds side by side" "$PY" bench/grid_cost.py --config config/studies/earlystop.yaml \
  --rounds 3 --methods fedavg fedsmoo --batch-clients --runs-together 3 --threads "$THREADS" --out "$OUT"
step "gpaf grid cost" "$PY" bench/grid_cost.py --config config/studies/gpaf.yaml --study gpaf --rounds 2 \
  --methods fedavg moon feddg gpaf --threads "$THREADS" --out "$OUT"
# 16 jobs with clients together did not fit in an H200's 139.8 GiB (8.3-9.2 GiB a process when they ran out)
step "jobs per GPU" "$PY" bench/gpu_packing.py --jobs 1 4 8 --rounds 4 --threads 2 --no-batch-clients --out "$OUT"
step "jobs per GPU, clients together" "$PY" bench/gpu_packing.py --jobs 1 4 8 --rounds 4 --threads 2 --batch-clients \
  --out "$OUT"
# the same with NVIDIA's Multi-Process Service on (bench/with_mps.sh): the jobs' kernels may run at the same time
# instead of taking turns on the GPU
step "jobs per GPU, clients together, MPS" bash bench/with_mps.sh "$PY" bench/gpu_packing.py --jobs 1 4 8 --rounds 4 \
  --threads 2 --batch-clients --out "$OUT"
# processes of three seeds side by side each (train.seeds_together), packed: about 3 x 9 GiB a process, so 4 of them
# may not fit an 80 GB card (the counts before a failing one are kept)
step "seeds side by side per GPU" "$PY" bench/gpu_packing.py --jobs 1 2 4 --rounds 4 --threads 2 --batch-clients \
  --runs-together 3 --out "$OUT"
# the surgical grids, ultraflwr first: their stand-ins are built from the start (ultraflwr's in seconds, fedst's in minutes)
# ultraflwr: 2 local epochs a round, scaled up to the paper's 20 epochs and all frames; the strategies differ
# only in which tensors are averaged, so FedAvg stands for all of them
if [ -z "${SURGICAL_DIR:-}" ]; then step "ultraflwr stand-in" bash -c "$WAIT_BUILD" "$STAND_IN" ultraflwr; fi
step "ultraflwr grid cost" "$PY" bench/grid_cost.py --config config/studies/ultraflwr.yaml --rounds 3 \
  --surgical-epochs 2 --surgical-dir "${SURGICAL_DIR:-$STAND_IN/ultraflwr}" --methods FedAvg --threads "$THREADS" \
  --no-image-cache --out "$OUT"
# the same with 8 dataloader workers in each local training and evaluation (ultraflwr.train.workers,
# engine.loader_workers; UltraFlwr loads in the process): what parallel loading saves on a GPU
step "ultraflwr grid cost, 8 loader workers" "$PY" bench/grid_cost.py --config config/studies/ultraflwr.yaml \
  --rounds 3 --surgical-epochs 2 --surgical-dir "${SURGICAL_DIR:-$STAND_IN/ultraflwr}" --methods FedAvg \
  --yolo-workers 8 --no-image-cache --threads "$THREADS" --out "$OUT"
# the same with every training and validation frame decoded once into IMAGE_CACHE at the training size
# (engine.image_cache, the paper config's default; the same samples): what it saves where loading bounds the round
step "ultraflwr grid cost, frame cache" "$PY" bench/grid_cost.py --config config/studies/ultraflwr.yaml \
  --rounds 3 --surgical-epochs 2 --surgical-dir "${SURGICAL_DIR:-$STAND_IN/ultraflwr}" --methods FedAvg \
  --image-cache "${IMAGE_CACHE:-$STAND_IN/frames}" --threads "$THREADS" --out "$OUT"
# the same with each local training's batches also read ahead in a thread while the model trains (engine.loader_workers 1;
# the same samples, and one dataloader worker in each evaluation): what overlapping loading with the step saves
step "ultraflwr grid cost, frame cache, read ahead" "$PY" bench/grid_cost.py --config config/studies/ultraflwr.yaml \
  --rounds 3 --surgical-epochs 2 --surgical-dir "${SURGICAL_DIR:-$STAND_IN/ultraflwr}" --methods FedAvg \
  --image-cache "${IMAGE_CACHE:-$STAND_IN/frames}" --loader-workers 1 --threads "$THREADS" --out "$OUT"
# several ultraflwr jobs on one GPU (the config's loading: frame store, read ahead), each job's peak GPU memory with
# them: the figure for ultraflwr.resources.gpu_mem_mb, which packs its jobs under profiles/gpu
step "ultraflwr jobs per GPU" "$PY" bench/gpu_packing.py --config config/studies/ultraflwr.yaml --study ultraflwr \
  --surgical-dir "${SURGICAL_DIR:-$STAND_IN/ultraflwr}" --method FedAvg --jobs 1 4 8 --rounds 3 --threads 2 \
  --image-cache "${IMAGE_CACHE:-$STAND_IN/frames}" --out "$OUT"
# one client's local epoch on the GPU: loaded as used, read ahead, and read ahead with each sample's last pixel steps in
# one more thread (the same weights; on 2 CPU cores the pixel thread saved nothing, the training bounds the epoch there)
step "ultraflwr pixel thread" "$PY" bench/yolo_read_ahead.py --surgical-dir "${SURGICAL_DIR:-$STAND_IN/ultraflwr}" \
  --epochs 2 --repeats 2 --pixel-thread --device cuda --threads "$THREADS" --out "$OUT"
# fedst: 3 rounds from a cold frame cache. FedST (SERQ on the server too) and FedAvg in two steps: each costs
# the whole grid at its rate, the upper and the lower bound
if [ -z "${SURGICAL_DIR:-}" ]; then step "fedst stand-in" bash -c "$WAIT_BUILD" "$STAND_IN" fedst; fi
step "fedst grid cost, FedAvg" "$PY" bench/grid_cost.py --config config/studies/fedst.yaml --rounds 3 \
  --surgical-dir "${SURGICAL_DIR:-$STAND_IN/fedst}" --methods seg_fedavg --no-image-cache --threads "$THREADS" --out "$OUT"
step "fedst grid cost, FedST" "$PY" bench/grid_cost.py --config config/studies/fedst.yaml --rounds 3 \
  --surgical-dir "${SURGICAL_DIR:-$STAND_IN/fedst}" --methods fedst --no-image-cache --threads "$THREADS" --out "$OUT"
# FedAvg again with each clip decoded once into IMAGE_CACHE (engine.image_cache; the same results): the rounds after
# the first read every clip from disk
step "fedst grid cost, FedAvg, clip cache" "$PY" bench/grid_cost.py --config config/studies/fedst.yaml --rounds 3 \
  --surgical-dir "${SURGICAL_DIR:-$STAND_IN/fedst}" --methods seg_fedavg --image-cache "${IMAGE_CACHE:-$STAND_IN/frames}" \
  --threads "$THREADS" --out "$OUT"
# 4 FedAvg jobs on one GPU against one (the clip store, as the step above): their throughput and GPU memory, the
# figure for fedst.resources.gpu_mem_mb, which packs its jobs under profiles/gpu
step "fedst jobs per GPU" "$PY" bench/gpu_packing.py --config config/studies/fedst.yaml --study fedst \
  --surgical-dir "${SURGICAL_DIR:-$STAND_IN/fedst}" --method seg_fedavg --jobs 1 4 --rounds 2 --threads 2 \
  --image-cache "${IMAGE_CACHE:-$STAND_IN/frames}" --out "$OUT"
# one round of 3 local epochs per method, the training centre's client holding most of PathMNIST's 89,996
# training images (the center scheme keeps a validation and a test share of them): the longest step
step "gpaf pathmnist grid cost" "$PY" bench/grid_cost.py --config config/studies/gpaf.yaml --study gpaf_pathmnist \
  --rounds 1 --methods fedavg moon feddg gpaf --threads "$THREADS" --out "$OUT"
# FedAvg's round again with its 5,900 steps waiting for the GPU each, as before: the small CNN's steps are
# launch-bound, so what the wait cost shows most here
step "gpaf pathmnist, FedAvg steps waiting" "$PY" bench/grid_cost.py --config config/studies/gpaf.yaml \
  --study gpaf_pathmnist --rounds 1 --methods fedavg --waiting-steps --threads "$THREADS" --out "$OUT"

if [ -n "${STEPS:-}" ] && [ ${#summary[@]} -eq 0 ]; then
  echo "gpu_session: STEPS='$STEPS' matches no step" >&2
  exit 2
fi
echo "== summary (rows in $OUT, output in $LOG)" | tee -a "$LOG"
printf '%s\n' "${summary[@]}" | tee -a "$LOG"
[ "$hard_failures" -eq 0 ]
