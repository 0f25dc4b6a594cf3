"""A test callback that writes, per training micro-batch, the step, learning rate, samples and loss."""

from __future__ import annotations

import json

from lightning.pytorch.callbacks import Callback


class StepRecorder(Callback):
    def __init__(self, path: str) -> None:
        self.path = path
        self._record: dict = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._record = {
            "rank": trainer.global_rank, "step": trainer.global_step, "epoch": trainer.current_epoch,
            "batch_idx": batch_idx,
            "lr": trainer.optimizers[0].param_groups[0]["lr"], "indices": batch["index"].tolist(),
            "cluster": type(getattr(trainer.strategy, "cluster_environment", None)).__name__,
        }

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._record["loss"] = float(outputs["loss"])
        # One flushed line per micro-batch (a kill loses at most the current one), one file per rank.
        with open(f"{self.path}.{trainer.global_rank}", "a") as f:
            f.write(json.dumps(self._record) + "\n")


class SignalAt(Callback):
    """Sends this process `signal` (``SIGINT``/``SIGTERM``) once, just before micro-batch `micro_batch`
    (0-based) of optimizer step `step`: a Ctrl-C that lands between two micro-batches of one step. `rank`: only
    on that rank (a cluster signalling one task of a job); None: on every one."""

    def __init__(self, signal: str, step: int, micro_batch: int, rank: int | None = None) -> None:
        self.signal, self.step, self.micro_batch, self.rank = signal, step, micro_batch, rank
        self._seen = 0  # micro-batches started in `step`

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        import os
        import signal

        if trainer.global_step != self.step or self.rank not in (None, trainer.global_rank):
            return
        if self._seen == self.micro_batch:
            os.kill(os.getpid(), getattr(signal, self.signal))
        self._seen += 1


class LogitsProbe(Callback):
    """At the end of training, the model's logits on a fixed batch (every rank computes them: a sharded
    forward is collective), written with the batch by rank 0 to `path` for comparison with the saved adapter."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_train_end(self, trainer, pl_module) -> None:
        import torch

        generator = torch.Generator().manual_seed(0)
        ids = torch.randint(3, pl_module.model.config.vocab_size, (2, 12), generator=generator)
        pl_module.model.eval()
        with torch.no_grad():
            logits = pl_module.model(input_ids=ids.to(pl_module.device)).logits.float().cpu()
        pl_module.model.train()
        if trainer.is_global_zero:
            torch.save({"input_ids": ids, "logits": logits}, self.path)


class ShardProbe(Callback):
    """Where each parameter is before the model is sharded (`setup` comes before `configure_model`) and which
    rows of it this process holds as training starts, with the rows' sum: one JSON file per rank."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.before: dict = {}

    def setup(self, trainer, pl_module, stage) -> None:
        self.before = {name: p.device.type for name, p in pl_module.model.named_parameters()}

    def on_fit_start(self, trainer, pl_module) -> None:
        from torch.distributed.tensor import DTensor

        after = {}
        for name, p in pl_module.model.named_parameters():
            local = p.to_local() if isinstance(p, DTensor) else p
            after[name] = {"rows": local.shape[0], "of": p.shape[0], "sum": float(local.double().sum()),
                           "device": local.device.type}
        self.after = after
        # How many other blocks' weights are gathered as each unit runs (its forward, its projections' backward):
        # a gathered unit's parameters are plain tensors, a sharded one's DTensors (weights gathered ahead are not
        # registered until their unit runs: bench/scale_out.py measures those by the memory they take).
        import re

        from torch.distributed.fsdp import FSDPModule

        blocks = [m for n, m in pl_module.model.named_modules() if re.fullmatch(r".*\.layers\.\d+", n)]
        assert len(blocks) == 2
        self.others = 0

        def gathered(block) -> bool:
            return any(not isinstance(p, DTensor) for p in block.parameters())

        def count(unit, args, block):
            self.others = max(self.others, sum(gathered(b) for b in blocks if b is not block))

        for block in blocks:
            for name, unit in block.named_modules():
                if isinstance(unit, FSDPModule):
                    unit.register_forward_pre_hook(lambda m, a, block=block: count(m, a, block))
                if name.endswith("base_layer"):  # and in backward, as each adapted projection's gradient is made
                    unit.register_full_backward_hook(lambda m, gi, go, block=block: count(m, gi, block))

    def on_train_end(self, trainer, pl_module) -> None:
        with open(f"{self.path}.{trainer.global_rank}", "w") as f:
            json.dump({"before": self.before, "after": self.after, "other_blocks_gathered": self.others}, f)
