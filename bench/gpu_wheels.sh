#!/usr/bin/env bash
# Wheels for a GPU machine that has a CUDA build of torch but no package index (an offline cluster
# node): the packages bench/gpu_session.sh imports beyond such an image's scientific stack (torch,
# torchvision, timm, numpy, pandas, scikit-learn, PyYAML, psutil, huggingface_hub are expected there),
# at envs/constraints.txt's versions, downloaded here for that machine's Python:
#   bash bench/gpu_wheels.sh [DIR] [PYTHON_VERSION]          (default: .whl, 3.12)
# Carry DIR there, then (the session installs them into /tmp/fedmedbench-site before its first step):
#   WHEELS=DIR PYTHON=python3 bash bench/gpu_session.sh
# Flower needs its own grpcio, protobuf, typer, click and rich versions (the image's may be other
# ones); medmnist is read for its dataset table (names, split sizes) only. Ultralytics (the ultraflwr
# grid) comes without polars (54 MB; only its plots and results.csv read it, which the study's trainer
# skips) and runs on the image's opencv-python-headless. MedPy (fedst's HD95 and ASSD) is published as a
# source archive only: it is built here into a pure-Python wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-.whl}
PYV=${2:-3.12}
PACKAGES=(flwr flwr-datasets datasets dill multiprocess grpcio grpcio-health-checking protobuf cryptography cffi
          pycparser pycryptodome iterators tomli tomli_w typer click rich jsonschema jsonschema-specifications
          referencing rpds-py platformdirs medmnist fire termcolor ultralytics ultralytics-thop)
pins=()
for p in "${PACKAGES[@]}"; do
  pin=$(grep -iE "^${p//[-_]/[-_]}==" envs/constraints.txt) || { echo "gpu_wheels: $p has no pin in envs/constraints.txt" >&2; exit 2; }
  pins+=("$pin")
done
mkdir -p "$DIR"
python3 -m pip download --no-deps --only-binary=:all: --python-version "$PYV" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$DIR" "${pins[@]}"
medpy=$(grep -ioE "^medpy==[^ ]+" envs/constraints.txt) || { echo "gpu_wheels: medpy has no pin in envs/constraints.txt" >&2; exit 2; }
python3 -m pip wheel --no-deps -w "$DIR" "$medpy"
echo "gpu_wheels: $((${#pins[@]} + 1)) packages in $DIR"
