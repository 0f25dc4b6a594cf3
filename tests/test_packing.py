"""data.packing: one unpadded row per micro-batch, attention within samples, the padded batch's loss."""

from __future__ import annotations

import csv

import pytest
import torch

from refusals import refused

from llasmol.data.collate import PackCollator, PadCollator
from llasmol.finetune.module import LoRACausalLM
from test_lora import tiny_peft_model


def _items(lengths=(7, 12, 5)) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    items = []
    for i, n in enumerate(lengths):
        ids = torch.randint(3, 60, (n,), generator=g).tolist()
        items.append({"input_ids": ids, "labels": [-100] * 2 + ids[2:], "index": i, "truncated": False})
    return items


def test_a_packed_row_restarts_positions_and_masks_each_first_label():
    batch = PackCollator()(_items())
    assert batch["input_ids"].shape == (1, 24) and batch["attention_mask"].sum() == 24
    assert batch["position_ids"][0].tolist() == list(range(7)) + list(range(12)) + list(range(5))
    starts = [0, 7, 19]
    assert all(batch["labels"][0, s] == -100 for s in starts)
    assert batch["index"].tolist() == [0, 1, 2]


@pytest.mark.parametrize("family", ["mistral", "llama2"])
def test_packed_loss_equals_the_padded_loss(family):
    module = LoRACausalLM(tiny_peft_model(family, "full").eval(), optimizer=None)
    items = _items()
    with torch.no_grad():
        padded = module(PadCollator(0)(items))
        packed = module(PackCollator()(items))
        # Without the block-diagonal mask (positions not restarting) the loss would differ: the check bites.
        leaky = PackCollator()(items)
        leaky["position_ids"] = torch.arange(leaky["input_ids"].shape[1])[None]
        leaked = module(leaky)
    assert packed == pytest.approx(padded.item(), rel=1e-5)
    assert leaked != pytest.approx(padded.item(), rel=1e-3)


def test_packing_refuses_a_base_whose_positions_come_from_the_mask(cfg_factory):
    from llasmol.train import train

    with refused("data.packing=true", "model=galactica", "data.packing=false"):
        train(cfg_factory("model=galactica", "data.packing=true"))


def _losses(run_dir) -> list[float]:
    with (run_dir / "csv" / "metrics.csv").open() as fh:
        return [float(r["train/loss"]) for r in csv.DictReader(fh) if r["train/loss"]]


@pytest.mark.slow
def test_a_packed_run_trains_like_the_padded_run(tmp_path, cfg_factory):
    """Same micro-batches, same losses step by step (dropout off: its masks depend on the tensor shape)."""
    from llasmol.train import train

    common = ["trainer.max_steps=25", "val_every_n_steps=25", "lora.dropout=0.0", "trainer.log_every_n_steps=1",
              "callbacks.generation_evaluator.samples_per_task=0", "trainer.enable_progress_bar=false",
              "model.random_init=true"]  # the random base: far from the data, so 25 steps move its loss clearly
    padded = train(cfg_factory(*common, f"paths.output_dir={tmp_path / 'padded'}"))
    packed = train(cfg_factory(*common, "data.packing=true", f"paths.output_dir={tmp_path / 'packed'}"))
    assert len(_losses(tmp_path / "packed")) == 25
    assert _losses(tmp_path / "packed") == pytest.approx(_losses(tmp_path / "padded"), rel=1e-4)
    assert packed["metrics"]["val/loss"] == pytest.approx(padded["metrics"]["val/loss"], rel=1e-4)
    losses = _losses(tmp_path / "packed")
    assert sum(losses[-5:]) / 5 < losses[0] - 0.5  # and it learned something over 25 steps
