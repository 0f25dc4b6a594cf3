"""The LightningModule: a causal LM with LoRA adapters, trained on next-token loss."""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

import lightning as L
import torch

from llasmol.data.formatting import IGNORE_INDEX
from llasmol.core.run_lock import OBJECTIVE_KEY
from llasmol.finetune.distributed import SHARDED_KEY, uses_fsdp2
from llasmol.model.blocks import clean_name
from llasmol.core.errors import UserError


class LoRACausalLM(L.LightningModule):
    """Trains the adapters of `model` (a PEFT model); the optimizer and scheduler come from config.

    Checkpoints keep only the trainable tensors: the frozen base is reloaded from its source, so a 7B
    run's checkpoint is tens of MB, not 14 GB. Each records the objective it trains by (`objective`).
    """

    objective = "sft"  # conf/objective/'s name: what a checkpoint says it was trained by

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: Callable[..., torch.optim.Optimizer],
        scheduler: Optional[Callable[..., Any]] = None,
    ) -> None:
        super().__init__()
        self.model = model
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        self.strict_loading = False  # frozen base weights are not in our checkpoints

    def forward(self, batch: dict) -> torch.Tensor:
        if "position_ids" in batch:
            # A packed row (data.packing): no 2-D mask and no cache, so the model derives block-diagonal
            # attention from the restarting position ids.
            return self.model(
                input_ids=batch["input_ids"], position_ids=batch["position_ids"], labels=batch["labels"],
                use_cache=False,
            ).loss
        return self.model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"]
        ).loss

    @staticmethod
    def _target_tokens(batch: dict) -> int:
        # Tokens that carry loss after the causal shift: every label but each row's first.
        return int((batch["labels"][:, 1:] != IGNORE_INDEX).sum())

    def on_train_batch_start(self, batch: dict, batch_idx: int) -> None:
        self._batch_started = time.perf_counter()

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss = self(batch)
        if not torch.isfinite(loss):
            # Stop before a non-finite update reaches the weights; checkpoints so far stay the last good ones.
            last = next((c.last_model_path for c in self.trainer.checkpoint_callbacks if c.last_model_path), "")
            resume = f"resume from the last good checkpoint with ckpt_path={last}" if last else "start again"
            raise UserError(
                f"training loss became {loss.item()} in step {self.global_step + 1}: lower optimizer.lr "
                f"(now {self.optimizers().param_groups[0]['lr']:g}) or clip gradients (trainer.gradient_clip_val=1.0, the "
                f"paper recipe's; now {self.trainer.gradient_clip_val}), then {resume}"
            )
        n = batch["input_ids"].shape[0]
        self.log("train/loss", loss, prog_bar=True, batch_size=n)
        self.log("train/truncated", batch["truncated"].sum().float(), reduce_fx="sum", on_step=False, on_epoch=True,
                 sync_dist=True)
        self.log("train/lr", self.optimizers().param_groups[0]["lr"], batch_size=n)
        self._batch_tokens = int(batch["attention_mask"].sum())
        return loss

    def on_train_batch_end(self, outputs, batch: dict, batch_idx: int) -> None:
        # Useful (non-padding) tokens per second of this process, forward + backward (+ step) included.
        elapsed = time.perf_counter() - self._batch_started
        if elapsed > 0:
            self.log("train/tokens_per_sec", self._batch_tokens / elapsed, batch_size=batch["input_ids"].shape[0])

    last_validated_step: Optional[int] = None  # the optimizer step of the latest validation

    def on_validation_epoch_end(self) -> None:
        if not self.trainer.sanity_checking:
            self.last_validated_step = self.global_step

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        loss = self(batch)
        tokens = self._target_tokens(batch)
        if tokens == 0:  # only padding (a rank's share made as long as the others'): its mean is 0/0
            loss = torch.zeros_like(loss)
        # Weighted by target tokens, so val/loss is the per-token loss of the whole split.
        self.log("val/loss", loss, prog_bar=True, sync_dist=True, batch_size=tokens)
        self.log("val/truncated", batch["truncated"].sum().float(), reduce_fx="sum", sync_dist=True)

    def configure_optimizers(self) -> Any:
        params = [p for p in self.model.parameters() if p.requires_grad]
        optimizer = self.optimizer_factory(params)
        if self.scheduler_factory is None:
            return optimizer
        scheduler = self.scheduler_factory(optimizer, num_training_steps=self.trainer.estimated_stepping_batches)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def _trainable_keys(self) -> set[str]:
        # Clean names: under torch.compile or a checkpoint wrapper the modules are wrapped, the state dict is not.
        return {f"model.{clean_name(name)}" for name, p in self.model.named_parameters() if p.requires_grad}

    def adapter_state_dict(self, state_dict: dict) -> dict:
        """The trainable tensors of a Lightning state dict, keyed as the PEFT model names them."""
        trainable = self._trainable_keys()
        return {k[len("model."):]: v for k, v in state_dict.items() if k in trainable}

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        trainable = self._trainable_keys()
        checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if k in trainable}
        # trainer=fsdp keys its optimizer state by the place among all parameters, the others among the trained
        # ones: a resume checks it continues under the same kind (`llasmol.finetune.resume`).
        checkpoint[SHARDED_KEY] = uses_fsdp2(self.trainer)
        checkpoint[OBJECTIVE_KEY] = self.objective  # a resume under another objective is refused (`resume`)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        if "state_dict" in checkpoint:  # trainer=fsdp checks the weights as it loads them, before this hook
            self.check_adapter_keys(set(checkpoint["state_dict"]))

    def check_adapter_keys(self, saved: set[str]) -> None:
        """Loading is not strict (the frozen base is not in the file), so check that a checkpoint holds exactly
        this model's adapters: another LoRA variant or base would silently load nothing."""
        wanted = self._trainable_keys()
        if saved != wanted:
            example = sorted(wanted - saved or saved - wanted)[0]
            raise UserError(
                f"the checkpoint's adapters do not match this model ({len(saved)} saved tensors, {len(wanted)} "
                f"trainable; e.g. {example}): resume with the run's model= and lora= options"
            )

    def configure_model(self) -> None:
        # Lightning's hook for sharding a model: trainer=fsdp (`FSDP2Strategy.shard`) shards it here, once.
        if uses_fsdp2(self.trainer):
            self.trainer.strategy.shard(self.model)
