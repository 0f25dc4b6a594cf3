#!/usr/bin/env bash
# GPU check (issue #6): Mistral-7B-shaped random bf16 model, 20 LoRA steps on 512-token micro-batches and
# one beam-search batch; prints tokens/s, peak memory and MFU. Then a few QLoRA steps (issue #24). Needs an NVIDIA GPU and the project's venv
# (bash .ci/run, or pip install -e .); downloads nothing. Extra arguments go to bench/gpu_check.py, e.g.
#   bash bench/gpu_check.sh --gradient-checkpointing --out bench/results/gpu_check.json
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python )}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
timeout 300 "$PYTHON" bench/gpu_check.py "$@"
# QLoRA on the GPU (issue #24): the same shape with 4 decoder layers, its base in NF4 through llasmol's own
# loader, 5 steps of 8-bit AdamW with activation recomputation, as quantization=4bit trains.
echo "QLoRA (4-bit base, 4 layers):"
timeout 300 "$PYTHON" bench/gpu_check.py --quantization 4bit --layers 4 --steps 5 --gradient-checkpointing \
  --new-tokens 16 --out bench/results/gpu_check_qlora.json
