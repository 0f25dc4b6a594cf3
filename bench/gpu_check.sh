#!/usr/bin/env bash
# GPU check (issues #6, #24, #36, #50), one script for a lent GPU machine; parts capped at 200+120+120(+150) s:
#   1. a Mistral-7B-shaped random bf16 model, 20 LoRA steps on 512-token micro-batches and one beam-search batch:
#      tokens/s, peak memory, MFU (bench/gpu_check.py);
#   2. QLoRA: the same shape with 4 layers, its base in NF4 through llasmol's loader, 5 steps of 8-bit AdamW;
#   3. FSDP2 (trainer=fsdp's strategy) through Lightning: 2 steps of the 7B-wide stack with 2 layers, bf16 weights
#      and fp32 reduction, a checkpoint saved and resumed (bench/scale_out.py), with the host's and the GPU's peak
#      memory; once with the base read shard by shard after sharding, once with it built whole first;
#   4. where RDKit, TRL and datasets are installed (not on the bare image): GRPO steps of the 7B-wide stack with 2
#      layers beside TRL's GRPOTrainer, 8 prompts x 8 completions of 128 tokens (bench/grpo_vs_trl.py), 150 s.
# It starts on the bare GPU image: what the image lacks (hydra-core, omegaconf, antlr4, bitsandbytes) is unpacked
# from bench/wheels/ (fetched beforehand with `bash bench/gpu_wheels.sh`; git ignores it, so name it among the paths
# carried to the GPU machine beside the working tree) into a
# temporary folder. Without bitsandbytes' wheel, part 1 uses torch AdamW and part 2 is skipped, each said.
#   bash bench/gpu_check.sh              # results in bench/results/ (GPU_CHECK_OUT=<folder> for elsewhere)
#   bash bench/gpu_check.sh --dry-run    # the same parts, tiny and on CPU: the imports and the flow
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
OUT="${GPU_CHECK_OUT:-bench/results}"
mkdir -p "$OUT"
dry=0
if [ "${1:-}" = "--dry-run" ]; then dry=1; shift; fi

deps="$(mktemp -d)"
trap 'rm -rf "$deps"' EXIT
for pair in hydra_core:hydra omegaconf:omegaconf antlr4_python3_runtime:antlr4 bitsandbytes:bitsandbytes; do
  wheel_name="${pair%%:*}" module="${pair##*:}"
  "$PYTHON" -c "import $module" 2>/dev/null && continue
  wheel="$(ls bench/wheels/"$wheel_name"-*.whl 2>/dev/null | head -n 1 || true)"
  if [ -n "$wheel" ]; then
    "$PYTHON" -m zipfile -e "$wheel" "$deps"  # a wheel is a zip of what site-packages would hold
    echo "unpacked $(basename "$wheel")"
  elif [ "$module" != bitsandbytes ]; then
    echo "error: python has no $module and bench/wheels/ no $wheel_name wheel: run bash bench/gpu_wheels.sh first" >&2
    exit 2
  fi
done
export PYTHONPATH="$PWD:$deps${PYTHONPATH:+:$PYTHONPATH}"
has_bnb=$("$PYTHON" -c "import importlib.util as u; print(int(u.find_spec('bitsandbytes') is not None))")

if [ "$dry" = 1 ]; then
  device=(--device cpu --arch tiny-mistral --steps 2 --warmup 1 --micro-batch 2 --seq-len 32 --prompts 2
          --prompt-len 8 --new-tokens 4 --beams 2 --returns 1)
  qlora=(--device cpu --arch tiny-mistral --layers 1 --steps 2 --warmup 1 --micro-batch 2 --seq-len 16 --prompts 1
         --prompt-len 4 --new-tokens 2 --beams 2 --returns 1)
  fsdp=(--accelerator cpu --arch tiny-mistral --steps 2 --micro-batch 2 --seq-len 32)
  grpo=(--prompts 1 --generations 2 --new-tokens 4 --steps 2 --rounds 1)
else
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  device=() qlora=(--layers 4 --steps 5 --new-tokens 16)
  fsdp=(--accelerator gpu --arch mistral-7b --layers 2 --steps 2 --micro-batch 4 --seq-len 512)
  grpo=(--device cuda --arch mistral-7b --layers 2 --dtype bfloat16 --prompts 8 --generations 8 --new-tokens 128
        --steps 4 --rounds 2)
fi
# Each part runs even when one before it failed (a lent GPU is one try): the exit status says whether all passed.
failed=()
part() {  # part <name> <seconds> <command...>
  local name="$1" seconds="$2"
  shift 2
  echo "== $name"
  timeout "$seconds" "$@" || { echo "== $name FAILED (exit $?)"; failed+=("$name"); }
}
part "LoRA steps and beam search" 200 "$PYTHON" bench/gpu_check.py "${device[@]}" --out "$OUT/gpu_check.json" "$@"
if [ "$has_bnb" = 1 ]; then
  part "QLoRA (4-bit base)" 120 "$PYTHON" bench/gpu_check.py "${qlora[@]}" --quantization 4bit \
    --gradient-checkpointing --out "$OUT/gpu_check_qlora.json"
else
  echo "== QLoRA skipped: bitsandbytes is not installed (bash bench/gpu_wheels.sh fetches its wheel)"
fi
# The base read shard by shard after sharding (trainer=fsdp's way), then built whole first (the way before #55):
# the host's peak resident memory and the GPU's peak allocation of each (the weights are written once, before).
part "FSDP2 (trainer=fsdp), one device" 150 "$PYTHON" bench/scale_out.py --case fsdp2 --devices 1 "${fsdp[@]}" \
  --out "$OUT/gpu_check_fsdp2.json"
part "FSDP2 over a base built whole, one device" 120 "$PYTHON" bench/scale_out.py --case fsdp2_whole --devices 1 \
  "${fsdp[@]}" --out "$OUT/gpu_check_fsdp2_whole.json"
# GRPO beside TRL needs RDKit (the rewards), TRL and datasets, which the bare image lacks and whose wheels (RDKit
# about 35 MB, pyarrow about 40 MB) do not fit beside bitsandbytes' in what is carried: run where they are.
if "$PYTHON" -c "import rdkit, trl, datasets" 2>/dev/null; then
  part "GRPO step beside TRL's GRPOTrainer" 150 "$PYTHON" bench/grpo_vs_trl.py "${grpo[@]}" \
    --out "$OUT/gpu_check_grpo.json"
else
  echo "== GRPO beside TRL skipped: python has no rdkit, trl or datasets (not on the bare image)"
fi
if [ "${#failed[@]}" -gt 0 ]; then
  echo "failed: ${failed[*]}" >&2
  exit 1
fi
