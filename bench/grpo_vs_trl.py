"""Benchmark 20: one GRPO step of `objective=grpo` beside TRL's `GRPOTrainer` with PEFT (issue #50 item 9).

Both train the same base (the tiny model's random weights, or --arch's shape) with the same LoRA adapters (one
PEFT config: rank, targets, dropout), on the same prompts in the same order (the bundled training split of
--task, P prompts a step, no shuffling), with the same group size, completion bound, sampling (temperature 1,
top-p 1, no top-k), loss (`dapo`), beta 0 (neither runs a reference pass), AdamW at one constant learning rate,
and the same reward function (llasmol's, called once per completion by each). A step is timed from its start
to its end (rollouts, rewards, loss, backward, optimizer step): Lightning's batch hooks for ours, the
transformers Trainer's step hooks for TRL. The two alternate in rounds (which goes first alternates too) so
both see the same machine load; each round's first step (the optimizer's state is made) is left out.

    python bench/grpo_vs_trl.py [--prompts 4] [--generations 4] [--new-tokens 64] [--steps 6] [--rounds 4]
    python bench/grpo_vs_trl.py --device cuda --arch mistral-7b --layers 2 --dtype bfloat16   # on a GPU

The completion lengths of both are reported: a random base seldom ends early, so both generate --new-tokens.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import compose_config, write_result  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="forward_synthesis")
    p.add_argument("--prompts", type=int, default=4, help="prompts a step (each sampled --generations times)")
    p.add_argument("--generations", type=int, default=4)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--steps", type=int, default=6, help="steps a round (the first is left out)")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--lora", default="full")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--arch", default=None, help="a bundled architecture whose shape replaces the tiny model's")
    p.add_argument("--layers", type=int, default=None, help="with --arch: this many transformer blocks")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--out", default=None, help="the result file (default bench/results/grpo_vs_trl.json)")
    return p.parse_args(argv)


def arch_folder(args, root: Path) -> str | None:
    """A folder holding --arch's config.json with --layers blocks: the tiny model's random base in that shape."""
    if args.arch is None:
        return None
    from llasmol.model.base import arch_facts

    facts = {**arch_facts(args.arch), **({"num_hidden_layers": args.layers} if args.layers else {})}
    folder = root / "arch"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(facts))
    return str(folder)


def compose(args, out: Path, arch: str | None):
    overrides = ["objective=grpo", f"lora={args.lora}", f"data.tasks=[{args.task}]", f"paths.output_dir={out}",
                 f"data.micro_batch_size={args.prompts}", f"data.effective_batch_size={args.prompts}",
                 f"objective.num_generations={args.generations}", f"objective.max_new_tokens={args.new_tokens}",
                 f"generation.max_new_tokens_limit={args.new_tokens}", f"optimizer.lr={args.lr}",
                 "lora.dropout=0", f"model.dtype={args.dtype}", *([f"model.arch={arch}"] if arch else [])]
    return compose_config(overrides)


class Ours:
    """llasmol's GRPO module under a Lightning trainer with the per-step callbacks a run has."""

    def __init__(self, cfg, order: list[int], device: str) -> None:
        from llasmol.finetune.build import build_datamodule, build_model, build_module
        from llasmol.model.base import load_tokenizer

        self.cfg, self.device = cfg, device
        self.tokenizer = load_tokenizer(cfg.model)
        self.datamodule = build_datamodule(cfg, self.tokenizer)
        self.datamodule.setup("fit")
        self.model, _ = build_model(cfg, self.tokenizer)
        self.module = build_module(cfg, self.model, self.datamodule)
        self.order = order

        from torch.utils.data import DataLoader, Subset

        data = Subset(self.datamodule.dataset("train"), order)
        self.datamodule.train_dataloader = lambda: DataLoader(data, batch_size=cfg.data.micro_batch_size,
                                                              collate_fn=self.datamodule.train_collate)

    def round(self, steps: int) -> list[float]:
        import lightning as L
        import torch
        from lightning.pytorch.callbacks import Callback

        from llasmol.finetune.resume import StepSeeding, StopAtStepBoundary

        cuda = self.device == "cuda"
        times: list[float] = []

        class Clock(Callback):
            def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
                if cuda:
                    torch.cuda.synchronize()
                self.started = time.perf_counter()

            def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
                if cuda:
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - self.started)

        trainer = L.Trainer(accelerator="gpu" if cuda else "cpu", devices=1, precision="32-true", max_steps=steps,
                            logger=False, enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0,
                            use_distributed_sampler=False, default_root_dir=self.cfg.paths.output_dir,
                            callbacks=[StepSeeding(self.cfg.seed), StopAtStepBoundary(), Clock()])
        trainer.fit(self.module, datamodule=self.datamodule)
        return times

    def lengths(self) -> list[int]:
        folder = Path(self.cfg.paths.output_dir) / "rollouts"
        return [json.loads(line)["tokens"] for path in sorted(folder.glob("step*.jsonl"))
                for line in path.read_text().splitlines()]


class Theirs:
    """TRL's GRPOTrainer given the same base, the same PEFT config, prompts, settings and reward."""

    def __init__(self, args, cfg, ours: Ours, out: Path) -> None:
        import copy

        from datasets import Dataset
        from transformers import TrainerCallback
        from trl import GRPOConfig, GRPOTrainer

        from llasmol.inference.pipeline import split_golds
        from llasmol.model.base import load_base_model

        dm, tokenizer = ours.datamodule, ours.tokenizer
        split, golds = dm.split("train"), split_golds(dm.split("train"))
        rewards = ours.module.rewards
        prompts = [dm.formatter.prompt(split[i]["input"]) for i in ours.order]
        for i, text in zip(ours.order, prompts):  # TRL tokenizes the prompt text itself (BOS added)
            assert tokenizer(text)["input_ids"] == dm.dataset("train")[i]["input_ids"], "prompt ids differ"
        self.completion_lengths: list[int] = []

        def reward(prompts, completions, completion_ids, index, **_):
            self.completion_lengths.extend(len(ids) for ids in completion_ids)
            return [rewards(split[i]["task"], text.strip(), golds.golds(split[i], split[i]["raw_output"]))[0]
                    for i, text in zip(index, completions)]

        self.times: list[float] = []
        times, cuda = self.times, args.device == "cuda"

        class Clock(TrainerCallback):
            def on_step_begin(self, *a, **k):
                import torch

                if cuda:
                    torch.cuda.synchronize()
                self.started = time.perf_counter()

            def on_step_end(self, *a, **k):
                import torch

                if cuda:
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - self.started)

        config = GRPOConfig(
            output_dir=str(out), per_device_train_batch_size=args.prompts * args.generations,
            num_generations=args.generations, max_completion_length=args.new_tokens, temperature=1.0, top_p=1.0,
            top_k=0, beta=0.0, loss_type="dapo", scale_rewards="group", epsilon=0.2, num_iterations=1,
            gradient_accumulation_steps=1, learning_rate=args.lr, lr_scheduler_type="constant", weight_decay=0.0,
            max_grad_norm=0.0, gradient_checkpointing=False, max_steps=args.steps, shuffle_dataset=False, save_strategy="no", report_to="none",
            logging_steps=10**6, disable_tqdm=True, use_cpu=not cuda, bf16=False, seed=cfg.seed,
            dataloader_num_workers=0)
        base = load_base_model(cfg.model, tokenizer)
        peft_config = copy.deepcopy(ours.model.peft_config["default"])
        self.trainer = GRPOTrainer(model=base, reward_funcs=reward, args=config, processing_class=tokenizer,
                                   peft_config=peft_config, callbacks=[Clock()],
                                   train_dataset=Dataset.from_dict({"prompt": prompts, "index": ours.order}))

    def round(self, steps: int) -> list[float]:
        self.times.clear()
        self.trainer.train()
        return list(self.times[:steps])


def main(argv=None) -> None:
    args = parse_args(argv)
    import torch

    root = Path(tempfile.mkdtemp(prefix="llasmol-grpo-bench-"))
    cfg = compose(args, root / "ours", arch_folder(args, root))
    order = list(range(args.prompts * args.steps))  # the first prompts of the split, the same for every round
    ours = Ours(cfg, order, args.device)
    theirs = Theirs(args, cfg, ours, root / "trl")
    trainable = {"ours": sum(p.numel() for p in ours.model.parameters() if p.requires_grad),
                 "trl": sum(p.numel() for p in theirs.trainer.model.parameters() if p.requires_grad)}
    assert trainable["ours"] == trainable["trl"], trainable
    runs = {"ours": ours, "trl": theirs}
    steps: dict[str, list[float]] = {"ours": [], "trl": []}
    ratios = []
    for r in range(args.rounds):
        medians = {}
        for name in (["ours", "trl"] if r % 2 == 0 else ["trl", "ours"]):
            times = runs[name].round(args.steps)[1:]  # the first step of a round makes the optimizer's state
            steps[name].extend(times)
            medians[name] = statistics.median(times)
        ratios.append(medians["trl"] / medians["ours"])
        print(f"round {r + 1}: ours {medians['ours']:.3f} s/step, TRL {medians['trl']:.3f} s/step "
              f"(TRL/ours {ratios[-1]:.2f})", flush=True)
    lengths = {"ours": ours.lengths(), "trl": theirs.completion_lengths}
    summary = {name: {"median_s_per_step": statistics.median(t), "mean_s_per_step": statistics.fmean(t),
                      "steps_timed": len(t), "mean_completion_tokens": statistics.fmean(lengths[name]),
                      "trainable_parameters": trainable[name]} for name, t in steps.items()}
    for name, s in summary.items():
        s["completion_tokens_per_s"] = args.prompts * args.generations * s["mean_completion_tokens"] / s[
            "median_s_per_step"]
    result = {"settings": {k: v for k, v in vars(args).items() if k != "out"}, "torch_threads": torch.get_num_threads(),
              "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", **summary,
              "trl_over_ours_by_round": ratios, "trl_over_ours": summary["trl"]["median_s_per_step"]
              / summary["ours"]["median_s_per_step"]}
    print(json.dumps({k: result[k] for k in ("ours", "trl", "trl_over_ours")}, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    else:
        write_result("grpo_vs_trl", result)


if __name__ == "__main__":
    main()
