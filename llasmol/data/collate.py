"""Pad a list of encoded samples into a batch."""

from __future__ import annotations

import torch

from llasmol.data.formatting import IGNORE_INDEX


class PadCollator:
    """Right-pads to the longest sample of the micro-batch; padding never contributes to the loss."""

    def __init__(self, pad_token_id: int) -> None:
        self.pad_token_id = pad_token_id

    def __call__(self, items: list[dict]) -> dict:
        length = max(len(it["input_ids"]) for it in items)
        n = len(items)
        input_ids = torch.full((n, length), self.pad_token_id, dtype=torch.long)
        labels = torch.full((n, length), IGNORE_INDEX, dtype=torch.long)
        attention_mask = torch.zeros((n, length), dtype=torch.long)
        for row, it in enumerate(items):
            k = len(it["input_ids"])
            input_ids[row, :k] = torch.tensor(it["input_ids"])
            labels[row, :k] = torch.tensor(it["labels"])
            attention_mask[row, :k] = 1
        return {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "labels": labels,
            "index": torch.tensor([it["index"] for it in items]),
            "truncated": torch.tensor([it["truncated"] for it in items], dtype=torch.bool),
        }
