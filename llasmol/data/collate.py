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


class PackCollator:
    """Concatenates a micro-batch into one row with no padding (`data.packing=true`).

    Position ids restart at 0 for every sample; given position ids and no 2-D attention mask, transformers
    builds a block-diagonal causal mask from them, so no token attends across a sample boundary. Each
    sample's first label is masked (it would be predicted from the previous sample's last token; in a
    padded batch the shift drops it too), so the row's token-mean loss is the padded batch's exactly.
    """

    def __call__(self, items: list[dict]) -> dict:
        labels = [torch.tensor(it["labels"]) for it in items]
        for row in labels:
            row[0] = IGNORE_INDEX
        input_ids = torch.cat([torch.tensor(it["input_ids"]) for it in items])[None]
        return {
            "input_ids": input_ids,
            "labels": torch.cat(labels)[None],
            "position_ids": torch.cat([torch.arange(len(it["input_ids"])) for it in items])[None],
            "attention_mask": torch.ones_like(input_ids),  # every token is real (counting only; not passed on)
            "index": torch.tensor([it["index"] for it in items]),
            "truncated": torch.tensor([it["truncated"] for it in items], dtype=torch.bool),
        }


class PromptCollator:
    """Left-pads prompts alone (`data` of an objective that samples its own completions, GRPO), so that every row's
    next token is at the same position, as generation needs."""

    def __init__(self, pad_token_id: int) -> None:
        self.pad_token_id = pad_token_id

    def __call__(self, items: list[dict]) -> dict:
        length = max(len(it["input_ids"]) for it in items)
        input_ids = torch.full((len(items), length), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(items), length), dtype=torch.long)
        for row, it in enumerate(items):
            k = len(it["input_ids"])
            input_ids[row, length - k:] = torch.tensor(it["input_ids"])
            attention_mask[row, length - k:] = 1
        return {"input_ids": input_ids, "attention_mask": attention_mask,
                "index": torch.tensor([it["index"] for it in items])}
