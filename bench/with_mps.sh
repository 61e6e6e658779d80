#!/usr/bin/env bash
# Runs a command with NVIDIA's Multi-Process Service on: the CUDA processes it starts share one GPU context
# server, so kernels of several training jobs can run on the GPU at the same time instead of taking turns
# (time slices). Several small-kernel jobs packed on one GPU are the case it serves.
#   bash bench/with_mps.sh COMMAND [ARGS...]
# Needs nvidia-cuda-mps-control (NVIDIA's driver utilities) and the right to start it (root, or the GPU's
# owner); exits 2 when it is missing. The daemon's pipe and log folders are temporary; it is stopped when the
# command ends, whatever its exit status, which is this script's. The command sees FMB_MPS=1.
set -uo pipefail
if [ $# -eq 0 ]; then echo "with_mps: no command given" >&2; exit 2; fi
if ! command -v nvidia-cuda-mps-control >/dev/null 2>&1; then
  echo "with_mps: nvidia-cuda-mps-control is not on the PATH (NVIDIA's driver utilities)" >&2
  exit 2
fi
MPS_DIR=$(mktemp -d)
export CUDA_MPS_PIPE_DIRECTORY="$MPS_DIR/pipe" CUDA_MPS_LOG_DIRECTORY="$MPS_DIR/log"
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
if ! nvidia-cuda-mps-control -d; then
  echo "with_mps: the MPS daemon did not start (log: $CUDA_MPS_LOG_DIRECTORY)" >&2
  rm -rf "$MPS_DIR"
  exit 2
fi
stop() { echo quit | nvidia-cuda-mps-control >/dev/null 2>&1; rm -rf "$MPS_DIR"; }
trap stop EXIT
FMB_MPS=1 "$@"
