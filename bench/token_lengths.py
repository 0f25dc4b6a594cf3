"""Token lengths of the bundled sample under a real Mistral tokenizer, per task.

    python bench/token_lengths.py                     # Mistral-7B-v0.1 (SentencePiece v1)
    python bench/token_lengths.py mistral_v03         # Mistral-7B-v0.3 (SentencePiece v3)
    python bench/token_lengths.py mistral_nemo        # Mistral-NeMo-12B (Tekken)

For each task: samples, the median / 99th percentile / longest `<s>[INST] query [/INST] response</s>`,
the share within the paper's 512-token input length (Sec. 5.1: "covers 99.7% of the samples" of the
full SMolInstruct), and the longest gold answer a model must generate, through its closing tag, against
the paper configuration's budget. Also the padding share of the paper's micro-batches (4 random samples,
padded to their longest and to a multiple of 8 as the official collator does), which sets how far the
official loss (summed over tokens, divided by all positions) is from our token mean.
"""

from __future__ import annotations

import random
import statistics
import sys
import tempfile

from _common import ROOT, WHEEL_TOKENIZERS, compose_config, MAX_LENGTH, SEED, mistral_tokenizer_folder, wheel_tokenizer_folder, write_result

from llasmol.data.formatting import PromptFormatter
from llasmol.data.smolinstruct import SMolInstructSplit
from llasmol.inference.beam_search import task_settings
from llasmol.core.tasks import get_task
from llasmol.model.base import load_tokenizer

BUNDLED = ROOT / "llasmol" / "data" / "bundled"


def answer_length(tok, formatter: PromptFormatter, sample: dict) -> int:
    """New tokens a model must generate for the gold response up to and including its answer's closing tag."""
    tag = get_task(sample["task"]).answer_tag
    response = sample["output"]
    if tag is not None:
        response = response[: response.index(f"</{tag}>") + len(f"</{tag}>")]
    prompt = formatter.prompt_ids(sample["input"])
    return len(tok(formatter.bos_text + formatter.prompt(sample["input"]) + " " + response,
                   add_special_tokens=False)["input_ids"]) - len(prompt)


def main(model: str = "mistral") -> None:
    if model == "mistral":
        folder = mistral_tokenizer_folder(tempfile.mkdtemp(), legacy=True)
        source = "tokenizer.model.v1"
    elif model in WHEEL_TOKENIZERS:
        folder = wheel_tokenizer_folder(tempfile.mkdtemp(), model)
        source = WHEEL_TOKENIZERS[model][0]
    else:
        raise SystemExit(f"error: no real tokenizer ships for model {model!r}: use mistral, {', '.join(WHEEL_TOKENIZERS)}")
    cfg = compose_config([f"model={model}", f"model.path={folder}"])
    tok = load_tokenizer(cfg.model)
    formatter = PromptFormatter(tok, cfg.model.prompt_template, max_length=10**9)
    tasks = sorted(p.stem for p in (BUNDLED / "core_tag").glob("*.json"))
    rows, all_lengths = {}, []
    for task in tasks:
        lengths, answers = [], []
        for split in ("train", "dev", "test"):
            data = SMolInstructSplit(BUNDLED, split, [task])
            for i in range(len(data)):
                sample = data[i]
                lengths.append(len(formatter.encode(sample["input"], sample["output"]).input_ids))
                answers.append(answer_length(tok, formatter, sample))
        lengths.sort()
        all_lengths += lengths
        rows[task] = {
            "samples": len(lengths),
            "median": statistics.median(lengths),
            "p99": lengths[int(0.99 * (len(lengths) - 1))],
            "max": lengths[-1],
            f"within_{MAX_LENGTH}": sum(n <= MAX_LENGTH for n in lengths) / len(lengths),
            "longest_answer": max(answers),
            "shortest_answer": min(answers),
            "max_new_tokens": task_settings(cfg.generation, task).max_new_tokens,
        }
    rng = random.Random(SEED)
    order = list(all_lengths)
    rng.shuffle(order)
    shares = []
    for start in range(0, len(order) - 3, 4):
        batch = order[start : start + 4]
        width = -(-max(batch) // 8) * 8
        shares.append(sum(batch) / (4 * width))
    padding = {"micro_batches": len(shares), "real_token_share_mean": statistics.mean(shares),
               "real_token_share_min": min(shares), "real_token_share_max": max(shares)}
    print(f"{'task':30} {'n':>5} {'median':>7} {'p99':>5} {'max':>5} {f'<={MAX_LENGTH}':>7} {'answer':>11} {'budget':>6}")
    for task, r in rows.items():
        print(f"{task:30} {r['samples']:5d} {r['median']:7.0f} {r['p99']:5d} {r['max']:5d} {r[f'within_{MAX_LENGTH}']:7.2%} "
              f"{r['shortest_answer']:4d}-{r['longest_answer']:<6d} {r['max_new_tokens']:6d}")
    within = sum(n <= MAX_LENGTH for n in all_lengths) / len(all_lengths)
    print(f"all tasks: {len(all_lengths)} samples, {within:.2%} within {MAX_LENGTH} tokens")
    print("paper micro-batches (4 random samples, padded to a multiple of 8): real tokens "
          f"{padding['real_token_share_mean']:.1%} of positions on average "
          f"({padding['real_token_share_min']:.1%}-{padding['real_token_share_max']:.1%})")
    name = "token_lengths" if model == "mistral" else f"token_lengths-{model}"
    write_result(name, {"model": cfg.model.hf_id, "tokenizer": f"mistral_common data/{source}",
                        "tasks": rows, f"within_{MAX_LENGTH}_all": within, "paper_micro_batches": padding})


if __name__ == "__main__":
    main(*sys.argv[1:2])
