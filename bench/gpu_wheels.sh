#!/usr/bin/env bash
# Fetches into bench/wheels/ (git-ignored) the wheels bench/gpu_check.sh needs on a bare GPU machine, whose image
# has Python 3.12, torch, transformers, peft, lightning, safetensors, accelerate and pytest but no registry:
# hydra-core, omegaconf and antlr4 (the configs) and bitsandbytes (the paper's 8-bit AdamW, QLoRA); CPython 3.12,
# manylinux x86-64, about 44 MB, carried to the GPU machine with the working tree (its limit: 64 MiB in all).
#   bash bench/gpu_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
dest=bench/wheels
mkdir -p "$dest"
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_24_x86_64 --platform manylinux2014_x86_64 -d "$dest" \
  hydra-core==1.3.8 omegaconf==2.3.1 bitsandbytes==0.50.2
# Hydra pins antlr4's 4.9 runtime, published as a source archive only: build its pure-Python wheel here.
[ -n "$(ls "$dest"/antlr4_python3_runtime-4.9.3-*.whl 2>/dev/null)" ] ||
  "$PYTHON" -m pip wheel --quiet --no-deps -w "$dest" antlr4-python3-runtime==4.9.3
size=$(du -sb "$dest" | cut -f1)
echo "bench/wheels: $(ls "$dest" | wc -l) wheels, $((size / 1048576)) MiB"
if [ "$size" -gt $((56 * 1048576)) ]; then  # beside the working tree (~4 MB) and under the 64 MiB carried
  echo "error: bench/wheels holds $((size / 1048576)) MiB, over the 56 MiB that fit beside the working tree: remove stale wheels" >&2
  exit 2
fi
