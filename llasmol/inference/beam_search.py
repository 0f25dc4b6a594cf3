"""Batched beam-search generation with the paper's per-task settings.

Prompts are formatted exactly as in training (`<s>[INST] {query} [/INST]`, `PromptFormatter.prompt_ids`),
sorted by length so each batch wastes little padding, left-padded (so every row's next token is at the same
position) and decoded without the prompt. Prompts longer than `max_prompt_tokens` are skipped and reported as skipped.

A model sharded with FSDP2 over several processes (trainer=fsdp) all-gathers its weights in every forward,
a collective: its ranks generate in lockstep. Each `generate` call runs until every rank's call has finished
(`synced_gpus`), and a rank with fewer batches than the others makes up the difference with idle calls
(`BeamGenerator.idle`), so every rank makes as many calls and forwards as the others.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Optional

import torch
import torch.distributed as dist

from llasmol.core.tasks import SMOLINSTRUCT, TaskTable
from llasmol.inference.predictions import Responses
from llasmol.model.blocks import is_sharded


@dataclass(frozen=True)
class BeamSettings:
    num_beams: int
    num_return_sequences: int
    max_new_tokens: int
    early_stopping: bool = False


def task_settings(gen_cfg, task: Optional[str], tasks: TaskTable = SMOLINSTRUCT) -> BeamSettings:
    """The default settings overlaid with the task's own (a declared task's from its declaration in `tasks`, then
    `generation.tasks.<task>`), capped by `max_new_tokens_limit`; no task (None or ""): one question's
    (`generation.question`)."""
    if not task:
        merged = dict(gen_cfg["question"])
    else:
        declared = dict(tasks[task].generation) if task in tasks else {}
        merged = {**gen_cfg["default"], **declared, **(gen_cfg["tasks"].get(task) or {})}
    limit = gen_cfg.get("max_new_tokens_limit")
    if limit:
        merged["max_new_tokens"] = min(merged["max_new_tokens"], limit)
    return BeamSettings(int(merged["num_beams"]), int(merged["num_return_sequences"]), int(merged["max_new_tokens"]),
                        bool(merged.get("early_stopping", False)))


def generation_config(gen_cfg, tokenizer):
    """transformers' `GenerationConfig` of one question (`gen_cfg.question`: greedy, up to 1,024 new tokens, as the
    official `LlaSMolGeneration.generate` without settings), what an exported model decodes with unless told
    otherwise."""
    from transformers import GenerationConfig

    default = gen_cfg.question
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return GenerationConfig(num_beams=int(default.num_beams), num_return_sequences=int(default.num_return_sequences),
                            max_new_tokens=int(default.max_new_tokens), early_stopping=bool(default.early_stopping),
                            do_sample=False, eos_token_id=tokenizer.eos_token_id, pad_token_id=pad,
                            bos_token_id=tokenizer.bos_token_id)


def forward_is_collective(model: torch.nn.Module) -> bool:
    """Whether `model` is sharded (FSDP2) over more than one process, so that every forward is collective."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1 and is_sharded(model)


def most_of_any_rank(count: int, device: torch.device) -> int:
    """The largest `count` of any rank (collective; `device`: where this rank's backend takes tensors)."""
    value = torch.tensor([count], dtype=torch.long, device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return int(value)


class BeamGenerator:
    """Generates responses for many queries of one task at a time."""

    def __init__(self, model, tokenizer, formatter, max_prompt_tokens: Optional[int] = None, batch_size: int = 8) -> None:
        """`max_prompt_tokens`: longer prompts are skipped (None: none is; the commands pass
        `generation.max_prompt_tokens`)."""
        self.model = model
        self.tokenizer = tokenizer
        self.formatter = formatter
        self.max_prompt_tokens = max_prompt_tokens
        self.batch_size = batch_size
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.lockstep = forward_is_collective(model)  # see the module docstring
        # Responses are stripped, as the official LlaSMol generation strips them (general_prompter.py
        # get_response); a base model's extraction rules read them as generated (`strip = False`).
        self.strip = True

    def _fits(self, ids: list[int]) -> bool:
        return self.max_prompt_tokens is None or len(ids) <= self.max_prompt_tokens

    def encode(self, query: str) -> list[int]:
        return self.formatter.prompt_ids(query)

    def generate(self, queries: list[str], settings: BeamSettings) -> list[Optional[list[str]]]:
        """Responses (best first) per query; None where the prompt was too long and skipped."""
        results: list[Optional[list[str]]] = [None] * len(queries)
        for rows, outputs in self.generate_batches(queries, settings):
            for i, texts in zip(rows, outputs):
                results[i] = texts
        return results

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def count_batches(self, queries: list[str]) -> int:
        """How many `generate` calls `generate_batches(queries, ...)` makes (the skipped prompts make none)."""
        kept = sum(self._fits(self.encode(q)) for q in queries)
        return -(-kept // self.batch_size)

    @torch.no_grad()
    def idle(self, calls: int) -> None:
        """`calls` generate calls on a one-token prompt, answered by nobody: a lockstep rank with fewer batches
        than the others keeps taking part in their forwards."""
        for _ in range(calls):
            self._generate_batch([[self.pad_id]], BeamSettings(1, 1, 1))

    @torch.no_grad()
    def generate_batches(self, queries: list[str], settings: BeamSettings
                         ) -> Iterator[tuple[list[int], list[Optional[list[str]]]]]:
        """(positions in `queries`, their responses) batch by batch as each finishes, the skipped prompts
        (None) first. The batches depend only on the queries' prompt lengths, so the queries left after the
        first batches of a call form the same later batches when given alone (a continued evaluation)."""
        encoded = [self.encode(q) for q in queries]
        skipped = [i for i, ids in enumerate(encoded) if not self._fits(ids)]
        if skipped:
            yield skipped, [None] * len(skipped)
        todo = sorted((i for i, ids in enumerate(encoded) if self._fits(ids)),
                      key=lambda i: len(encoded[i]), reverse=True)
        for start in range(0, len(todo), self.batch_size):
            rows = todo[start : start + self.batch_size]
            yield rows, self._generate_batch([encoded[i] for i in rows], settings)

    def _generate_batch(self, prompts: list[list[int]], settings: BeamSettings) -> list[list[str]]:
        device = self.device
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, ids in enumerate(prompts):
            input_ids[row, width - len(ids) :] = torch.tensor(ids)
            attention_mask[row, width - len(ids) :] = 1
        out = self.model.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention_mask.to(device),
            num_beams=settings.num_beams,
            num_return_sequences=settings.num_return_sequences,
            max_new_tokens=settings.max_new_tokens,
            do_sample=False,
            early_stopping=settings.early_stopping,
            pad_token_id=self.pad_id,
            eos_token_id=self.tokenizer.eos_token_id,
            synced_gpus=self.lockstep,
        )
        texts = self.tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)
        ended = (out[:, width:] == self.tokenizer.eos_token_id).any(dim=1).tolist()
        k = settings.num_return_sequences
        if self.strip:
            texts = [t.strip() for t in texts]
        return [Responses(texts[row * k : (row + 1) * k], ended[row * k : (row + 1) * k]) for row in range(len(prompts))]
