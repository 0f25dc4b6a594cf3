"""Scale-out benchmark (issues #36 and #55): one process, DDP over 2 and FSDP2 over 2 (`trainer=fsdp`'s strategy, also
with `reshard_after_forward=false`: `fsdp2_keep`; and `fsdp2_whole`, FSDP2 over a base built whole on every process
before it is sharded, as before #55), on the tiny model and on a Mistral-7B-shaped stack of 2 decoder layers (full
width: 4096 hidden, 14336 FFN, 32000 vocabulary, random weights), and FSDP2 over 4 processes. Per case: the time
of an optimizer step, each process's peak and final resident memory, the bytes of parameters each process holds,
the time from the process's start to its first step, the checkpoint's size and save time, and the time to read it
back into a new run (the strategy's `load_checkpoint`) and to reach that run's first step.

    python bench/scale_out.py                         # every case, CPU over gloo; bench/results/scale_out.json
    python bench/scale_out.py --case fsdp2 --arch tiny-mistral --out /tmp/x.json   # one case (2 processes)

The base is read as a user's is: its random weights are written once as safetensors (model.path), then each case
builds it as `llasmol.train` does under its strategy (whole, or on the meta device and read shard by shard under
FSDP2), puts the paper's `full` LoRA on it and trains `LoRACausalLM` (AdamW) under Lightning on random token rows,
so that the figures are the strategy's, not the data's. bench/gpu_check.sh runs the FSDP2 case on one GPU
(`--accelerator gpu --devices 1`: bf16 weights, fp32 reduction).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import compose_config, write_result  # noqa: E402  (sets offline mode first)

# case: processes; fsdp2_keep is trainer.strategy.reshard_after_forward=false (a block's weights gathered once for
# each micro-batch's forward and backward, rather than once for each)
CASES = {"single": 1, "ddp": 2, "fsdp2": 2, "fsdp2_keep": 2, "fsdp2_whole": 2}
ARCHS = {"tiny-mistral": None, "mistral-7b": 2}  # architecture: decoder layers (None: its own)
MORE = [("mistral-7b", "fsdp2", 4)]  # (architecture, case, processes) run after the cases above: the scaling
STARTED = time.perf_counter()  # this process's start (each rank's: Lightning starts the others as this script)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--case", choices=list(CASES), default=None, help="one case (default: all, each a process)")
    p.add_argument("--arch", default="tiny-mistral", help="bundled architecture (llasmol/model/arch/*.json)")
    p.add_argument("--layers", type=int, default=None, help="decoder layers (default: the architecture's)")
    p.add_argument("--accelerator", default="cpu")
    p.add_argument("--devices", type=int, default=None, help="one case: processes (default: the case's)")
    p.add_argument("--steps", type=int, default=4, help="timed optimizer steps, after one untimed")
    p.add_argument("--micro-batch", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--out", type=Path, default=None, help="one case: its JSON (rank 0); all: default results file")
    p.add_argument("--weights", type=Path, default=None,
                   help="the base's folder (default: written once to a temporary folder named by its shape)")
    return p.parse_args(argv)


def _memory_mib(field: str = "VmRSS") -> float:
    """This process's resident memory now (VmRSS) or at its peak (VmHWM), MiB (Linux). Not getrusage's
    ru_maxrss: Linux carries it across exec from the process that started this one (a rank started by a rank
    that held the whole base would report that base as its own peak)."""
    with open("/proc/self/status") as fh:
        kib = next(int(line.split()[1]) for line in fh if line.startswith(f"{field}:"))
    return round(kib / 1024, 1)


def _model_cfg(args, cuda: bool, folder: Path):
    return compose_config(["model=mistral", "lora=full", "paths.output_dir=/unused", f"model.path={folder}",
                           f"model.dtype={'bfloat16' if cuda else 'float32'}"])


def weights_folder(arch: str, layers, cuda: bool, root: Path) -> Path:
    """The base's config.json and random weights as safetensors, written once (atomically: every rank of a case
    may ask) to a folder of `root` named by the architecture, depth and dtype."""
    import torch
    from transformers import AutoModelForCausalLM

    from llasmol.model.base import arch_config

    dtype = "bfloat16" if cuda else "float32"
    folder = root / f"llasmol-scale-{arch}-{layers or 'all'}-{dtype}"
    if (folder / "config.json").is_file():
        return folder
    config = arch_config(arch, **({"num_hidden_layers": layers} if layers else {}))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    partial_folder = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=folder.parent))
    model.save_pretrained(partial_folder)  # config.json last-but-one, weights, then the rename below
    del model
    os.replace(partial_folder, folder)
    return folder


def build_module(args, torch, cuda: bool, case: str):
    """`LoRACausalLM` over the base as `llasmol.train` builds it for `case`: on the meta device, read shard by
    shard after sharding, under trainer=fsdp (`fsdp2`, `fsdp2_keep`); whole otherwise (`fsdp2_whole`: whole, then
    sharded, as trainer=fsdp did before #55)."""
    from transformers import PreTrainedTokenizerFast

    from llasmol.finetune.module import LoRACausalLM
    from llasmol.model.base import TINY_TOKENIZER_DIR, load_base_model, load_base_on_meta
    from llasmol.model.lora import apply_lora

    folder = args.weights or weights_folder(args.arch, args.layers, cuda, Path(tempfile.gettempdir()))
    cfg = _model_cfg(args, cuda, folder)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(TINY_TOKENIZER_DIR))  # its pad id, if the base has none
    torch.manual_seed(0)  # the same adapters on every process
    on_meta = case in ("fsdp2", "fsdp2_keep")
    base = (load_base_on_meta if on_meta else load_base_model)(cfg.model, tokenizer)
    model = apply_lora(base, cfg.model, cfg.lora)
    model.train()
    return LoRACausalLM(model, optimizer=partial(torch.optim.AdamW, lr=1e-4, weight_decay=0.0)), base.config


def fit_case(args, case: str, devices: int) -> dict:
    """Fit `args.steps + 1` optimizer steps under `case`, save a checkpoint and resume from it for one more step;
    rank 0 returns the figures of every rank (each rank's own under `ranks`)."""
    import lightning as L
    import torch
    import torch.distributed as dist
    from lightning.pytorch.callbacks import Callback

    from llasmol.finetune.distributed import FSDP2Strategy

    cuda = args.accelerator != "cpu"
    module, config = build_module(args, torch, cuda, case)

    class Clock(Callback):
        def __init__(self) -> None:
            self.fit_started = time.perf_counter()
            self.first_batch = None
            self.steps: list[float] = []
            self._start = 0.0

        def _sync(self):
            if cuda:
                torch.cuda.synchronize()

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self._sync()
            self._start = time.perf_counter()
            if self.first_batch is None:
                self.first_batch = self._start - self.fit_started
                self.since_start = self._start - STARTED
                # the peak of building, sharding and reading the base, before any step's gathers
                self.peak_before = _memory_mib("VmHWM")

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self._sync()
            self.steps.append(time.perf_counter() - self._start)

    def rows(rank: int, n: int) -> list[dict]:
        out = []
        for step in range(n):
            g = torch.Generator().manual_seed(1000 * rank + step)
            ids = torch.randint(3, config.vocab_size, (args.micro_batch, args.seq_len), generator=g)
            out.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids,
                        "truncated": torch.zeros(args.micro_batch, dtype=torch.bool)})
        return out

    def trainer(max_steps: int, clock: Clock) -> L.Trainer:
        strategy = {"single": "auto", "ddp": "ddp", "fsdp2": FSDP2Strategy(), "fsdp2_whole": FSDP2Strategy(),
                    "fsdp2_keep": FSDP2Strategy(reshard_after_forward=False)}[case]
        return L.Trainer(accelerator="gpu" if cuda else "cpu", devices=devices, strategy=strategy,
                         precision="bf16-mixed" if cuda else "32-true", max_steps=max_steps, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         limit_val_batches=0, num_sanity_val_steps=0, use_distributed_sampler=False,
                         callbacks=[clock])

    steps = args.steps + 1
    clock = Clock()
    fresh = trainer(steps, clock)
    data = rows(fresh.global_rank, steps + 1)
    fresh.fit(module, train_dataloaders=torch.utils.data.DataLoader(data[:steps], batch_size=None))
    from torch.distributed.tensor import DTensor

    held = sum((p.to_local() if isinstance(p, DTensor) else p).nbytes for p in module.model.parameters())
    folder = Path(tempfile.mkdtemp(prefix="llasmol-scale-")) if fresh.is_global_zero else None
    if dist.is_available() and dist.is_initialized():
        shared = [str(folder)]
        dist.broadcast_object_list(shared, src=0)
        folder = Path(shared[0])
    path = folder / "last.ckpt"
    started = time.perf_counter()
    fresh.save_checkpoint(path)
    save_seconds = time.perf_counter() - started
    rank = fresh.global_rank
    mine = {"rank": rank, "median_step_seconds": round(statistics.median(clock.steps[1:]), 4),
            "parameter_bytes_held": held,
            "first_step_seconds": round(clock.since_start, 2),  # from the process's start: imports, build, load
            "peak_rss_before_first_step_mib": round(clock.peak_before, 1),
            "rss_after_fit_mib": _memory_mib(),
            "peak_rss_mib": _memory_mib("VmHWM"),
            "peak_gpu_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
            "checkpoint_save_seconds": round(save_seconds, 3)}

    # Resume: a new module and trainer, from the checkpoint, one step more (the first ones gone).
    del fresh, module
    gc.collect()
    module, _ = build_module(args, torch, cuda, case)
    again = Clock()
    resumed = trainer(steps + 1, again)
    loads = []
    load = resumed.strategy.load_checkpoint

    def timed_load(*a, **k):  # the adapters and optimizer state read into the (sharded) model
        started = time.perf_counter()
        try:
            return load(*a, **k)
        finally:
            loads.append(time.perf_counter() - started)

    resumed.strategy.load_checkpoint = timed_load
    resumed.fit(module, train_dataloaders=torch.utils.data.DataLoader(data, batch_size=None), ckpt_path=str(path),
                weights_only=True)
    mine["resumed_fit_start_seconds"] = round(again.first_batch, 3)
    mine["resume_load_seconds"] = round(sum(loads), 3)
    mine["resumed_steps"] = len(again.steps)
    everyone = [mine]
    if dist.is_available() and dist.is_initialized():
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
        # Left to the interpreter's exit, gloo's threads now and then end the process with "terminate called
        # without an active exception" (seen under DDP and FSDP2 alike, after the figures were written).
        dist.destroy_process_group()
    if rank != 0:
        return {}
    size = path.stat().st_size
    for p in folder.iterdir():
        p.unlink()
    folder.rmdir()
    first = everyone[0]
    return {"case": case, "processes": devices, "arch": args.arch, "layers": config.num_hidden_layers,
            "micro_batch": args.micro_batch, "seq_len": args.seq_len, "accelerator": args.accelerator,
            "median_step_seconds": max(r["median_step_seconds"] for r in everyone),
            "parameter_bytes_held_per_process": [r["parameter_bytes_held"] for r in everyone],
            "peak_rss_mib_per_process": [r["peak_rss_mib"] for r in everyone],
            "peak_rss_before_first_step_mib_per_process": [r["peak_rss_before_first_step_mib"] for r in everyone],
            "rss_after_fit_mib_per_process": [r["rss_after_fit_mib"] for r in everyone],
            "peak_gpu_gib": first["peak_gpu_gib"], "checkpoint_bytes": size,
            "first_step_seconds": max(r["first_step_seconds"] for r in everyone),
            "checkpoint_save_seconds": first["checkpoint_save_seconds"],
            "resume_load_seconds": first["resume_load_seconds"],
            "resumed_fit_start_seconds": first["resumed_fit_start_seconds"],
            "ranks": everyone}


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.case is not None:
        result = fit_case(args, args.case, args.devices or CASES[args.case])
        if result and args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=2) + "\n")
        if result:
            print(json.dumps(result))
        return result
    # Every case in a process of its own (Lightning starts the other processes of a case itself), each
    # architecture's weights written once beforehand by this process, whose memory no case counts.
    results = []
    runs = [(arch, case, CASES[case]) for arch in ARCHS for case in CASES] + MORE
    with tempfile.TemporaryDirectory() as tmp:
        for arch, case, devices in runs:
            layers = ARCHS[arch]
            folder = weights_folder(arch, layers, args.accelerator != "cpu", Path(tmp))
            out = Path(tmp) / f"{arch}-{case}-{devices}.json"
            cmd = [sys.executable, __file__, "--case", case, "--devices", str(devices), "--arch", arch,
                   "--steps", str(args.steps), "--micro-batch", str(args.micro_batch), "--seq-len", str(args.seq_len),
                   "--out", str(out), "--accelerator", args.accelerator, "--weights", str(folder),
                   *(["--layers", str(layers)] if layers else [])]
            print("running:", " ".join(cmd[2:]), flush=True)
            subprocess.run(cmd, check=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.DEVNULL)
            results.append(json.loads(out.read_text()))
            r = results[-1]
            print(f"  {r['median_step_seconds']} s/step, params held {r['parameter_bytes_held_per_process']}, "
                  f"peak RSS {r['peak_rss_mib_per_process']} MiB, first step after {r['first_step_seconds']} s",
                  flush=True)
    result = {"command": "python bench/scale_out.py", "load_average": os.getloadavg(), "cases": results}
    write_result("scale_out", result) if args.out is None else args.out.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
