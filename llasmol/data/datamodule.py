"""LightningDataModule over SMolInstruct: the Hub archive, a local copy, or the bundled sample."""

from __future__ import annotations

import logging
from typing import Any, Optional

import lightning as L
from torch.utils.data import DataLoader, Dataset

from llasmol.core.errors import UserError
from llasmol.core.tasks import SMOLINSTRUCT_WEIGHT
from llasmol.data.collate import PackCollator, PadCollator, PromptCollator
from llasmol.data.formatting import IGNORE_INDEX, PromptFormatter
from llasmol.data.resumable_loader import ResumableDataLoader
from llasmol.data.sampler import PADDING, ShardedShuffleSampler, draws
from llasmol.data.smolinstruct import SMolInstructSplit
from llasmol.data.source import SMolInstructSource


log = logging.getLogger(__name__)


class SMolInstructDataset(Dataset):
    """The formatted, tokenized samples of one split (`split`); each item is read and tokenized on demand."""

    def __init__(self, split: SMolInstructSplit, formatter: PromptFormatter) -> None:
        self.split = split
        self.formatter = formatter

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, i: int) -> dict:
        if i == PADDING:  # one token that carries no loss: a rank's evaluation share made as long as the others'
            token = self.formatter.tokenizer.eos_token_id  # every tokenizer here names one
            return {"input_ids": [token], "labels": [IGNORE_INDEX], "truncated": False, "index": PADDING}
        sample = self.split[i]
        enc = self.formatter.encode(sample["input"], sample["output"])
        return {"input_ids": enc.input_ids, "labels": enc.labels, "truncated": enc.truncated, "index": i}


class PromptDataset(Dataset):
    """The formatted prompts of one split without their answers (an objective that samples its own, GRPO): each
    item is its prompt's token ids and its index in the split, which names its task and golds."""

    def __init__(self, split: SMolInstructSplit, formatter: PromptFormatter) -> None:
        self.split = split
        self.formatter = formatter

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.formatter.prompt_ids(self.split[i]["input"]), "index": i}


class SMolInstructDataModule(L.LightningDataModule):
    """Serves the `train`, `validation` and `test` splits of the chosen tasks as token batches.

    Where the data is and how a split opens is the `SMolInstructSource` (path or Hub archive at
    `revision`, `splits`, `tasks`: null for every task the data has); this class adds tokenizing,
    batching, sharding and the resumable training order.
    """

    def __init__(
        self,
        tokenizer,
        *,
        prompt_template: str,
        max_length: int,
        train_on_inputs: bool,
        micro_batch_size: int,
        effective_batch_size: int,
        eval_batch_size: Optional[int],
        num_workers: int,
        seed: int,
        group_by_length: bool,
        packing: bool,
        weights: dict,
        prompts_only: bool = False,
        **source: Any,
    ) -> None:
        """The settings of the `data` group (conf/data/smolinstruct.yaml states their values; the schema has
        checked them). `source`: where the data is and how splits open (path, hub_id, revision, tasks,
        splits, ...: the fields and defaults of `SMolInstructSource`). `weights`: task (or `smolinstruct`, every
        SMolInstruct task not named) -> how many times each of its training samples is drawn per epoch. `prompts_only`:
        training batches are left-padded prompts without answers (objective=grpo); evaluation batches stay whole."""
        super().__init__()
        self.tokenizer = tokenizer
        self.source = SMolInstructSource(**source)
        self.formatter = PromptFormatter(tokenizer, prompt_template, max_length, train_on_inputs)
        self.micro_batch_size = micro_batch_size
        self.effective_batch_size = effective_batch_size
        self.eval_batch_size = eval_batch_size or micro_batch_size
        self.num_workers = num_workers
        self.seed = seed
        self.group_by_length = group_by_length
        self.weights = dict(weights or {})
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.collate = PadCollator(pad)
        # Training micro-batches as one unpadded row each; evaluation batches stay padded.
        self.train_collate = PackCollator() if packing else self.collate
        self.prompts_only = prompts_only
        if prompts_only:
            self.train_collate = PromptCollator(pad)
        self.datasets: dict[str, Dataset] = {}
        self._train_loader: Optional[ResumableDataLoader] = None
        self._resume_position: Optional[dict] = None
        self._checked_fit = False

    @property
    def path(self) -> Optional[str]:
        """The local data folder; None until a Hub archive is fetched."""
        return self.source.path

    @property
    def tasks(self) -> list[str]:
        return self.source.task_names()

    def gradient_accumulation(self, world_size: int) -> int:
        """Micro-batches per optimizer step so that micro × accumulation × world = effective batch."""
        per_step = self.micro_batch_size * world_size
        if self.effective_batch_size % per_step:
            fit = max(per_step, self.effective_batch_size // per_step * per_step)
            raise UserError(
                f"data.effective_batch_size={self.effective_batch_size} is not a multiple of "
                f"data.micro_batch_size={self.micro_batch_size} × {world_size} device(s): set "
                f"data.effective_batch_size={fit} (or another multiple of {per_step}), or change the micro-batch "
                "or device count"
            )
        return self.effective_batch_size // per_step

    def split(self, name: str) -> SMolInstructSplit:
        """The samples of split `name` (train, validation or test)."""
        return self.source.split(name)

    def dataset(self, name: str) -> Dataset:
        """The tokenized dataset of split `name`, built on first use (the training prompts alone for
        `prompts_only`)."""
        if name not in self.datasets:
            kind = PromptDataset if self.prompts_only and name == "train" else SMolInstructDataset
            self.datasets[name] = kind(self.split(name), self.formatter)
        return self.datasets[name]

    def prepare_data(self) -> None:
        self.source.root()  # a Hub download happens once, on the main process of each node

    def setup(self, stage: Optional[str] = None) -> None:
        wanted = {"fit": ["train", "validation"], "validate": ["validation"], "test": ["test"]}.get(
            stage, ["train", "validation", "test"]
        )
        for name in wanted:
            self.dataset(name)
        if stage == "fit" and not self._checked_fit:
            self._checked_fit = True
            self._check_fit_splits()

    def _check_fit_splits(self) -> None:
        """Every task trains (a task without a training sample is an error) and, said once, validates."""
        tasks = self.source.task_names()
        train, validation = self.split("train").counts(), self.split("validation").counts()
        untrained = [t for t in tasks if not train.get(t)]
        if untrained:
            raise UserError(f"task {untrained[0]} has no training sample in {', '.join(self.source.places())}: give "
                            "it training rows (a split column, a train file, or lower data.split_fractions), or leave "
                            "it out of data.tasks")
        unvalidated = [t for t in tasks if not validation.get(t)]
        if unvalidated:
            log.warning("no validation sample of %s: their answers are not scored during training (a split column, "
                        "a validation file, or data.split_fractions.validation gives them some)", ", ".join(unvalidated))

    def _rank_world(self) -> tuple[Optional[int], Optional[int]]:
        trainer = getattr(self, "trainer", None)
        if trainer is None:
            return None, None
        return trainer.global_rank, trainer.world_size

    def dataloader(self, name: str, shuffle: bool, batch_size: int, rank=None, world_size=None, collate=None) -> DataLoader:
        data = self.dataset(name)
        if rank is None:
            rank, world_size = self._rank_world()
        lengths = data.split.length_hints() if (shuffle and self.group_by_length) else None
        sampler = ShardedShuffleSampler(
            len(data), seed=self.seed, shuffle=shuffle, rank=rank, world_size=world_size, even=shuffle,
            lengths=lengths, batch_size=batch_size, weights=self.task_weights(data.split) if shuffle else None,
        )
        # Training remembers its place in the epoch (exact resume); evaluation always runs whole.
        loader = ResumableDataLoader if shuffle else DataLoader
        return loader(
            data,
            batch_size=batch_size,
            sampler=sampler,
            collate_fn=collate or self.collate,
            num_workers=self.num_workers,
        )

    def task_weights(self, split) -> Optional[list[tuple[int, int, float]]]:
        """(start, end, weight) of each task's samples in `split` by `weights`; None when every weight is 1."""
        counts = split.counts()
        absent = [name for name in self.weights if name != SMOLINSTRUCT_WEIGHT and name not in counts]
        if absent:
            raise UserError(f"data.weights names {absent[0]}, which this data's training split does not hold: it holds "
                            f"{', '.join(counts)}")
        if SMOLINSTRUCT_WEIGHT in self.weights and not any(self.source.table[t].in_smolinstruct for t in counts):
            raise UserError(f"data.weights.{SMOLINSTRUCT_WEIGHT} weighs SMolInstruct's tasks, and this data's training "
                            f"split holds none ({', '.join(counts)}): drop it, or weigh the tasks by name")
        blocks, start = [], 0
        for task, count in counts.items():
            default = self.weights.get(SMOLINSTRUCT_WEIGHT, 1.0) if self.source.table[task].in_smolinstruct else 1.0
            blocks.append((start, start + count, float(self.weights.get(task, default))))
            start += count
        return None if all(w == 1.0 for *_, w in blocks) else blocks

    def mix(self) -> Optional[str]:
        """The training mix in words, each task's samples, weight and share of an epoch; None for SMolInstruct
        alone, unweighted."""
        if not self.weights and self.source.copy() is not None:
            return None
        split = self.split("train")
        blocks = self.task_weights(split) or [(0, n, 1.0) for n in split.counts().values()]
        drawn = [whole * (e - s) + extra for s, e, w in blocks for whole, extra in [draws(e - s, w)]]
        total = sum(drawn) or 1
        return ", ".join(f"{task} {e - s:,}" + (f" x{w:g}" if w != 1 else "") + f" ({d / total:.1%})"
                         for task, (s, e, w), d in zip(split.counts(), blocks, drawn))

    def train_dataloader(self) -> DataLoader:
        loader = self.dataloader("train", shuffle=True, batch_size=self.micro_batch_size, collate=self.train_collate)
        if self._resume_position is not None:
            loader.load_state_dict(self._resume_position)
            self._resume_position = None
        self._train_loader = loader
        return loader

    # The training data position travels in checkpoints through the DataModule's state, which Lightning
    # restores before it first builds the train loader (the loader's own state would come too late: the
    # trainer builds the loader while setting up the scheduler, before it restores loop states).
    def state_dict(self) -> dict:
        return {"train_position": self._train_loader.state_dict()} if self._train_loader is not None else {}

    def load_state_dict(self, state: dict) -> None:
        self._resume_position = state.get("train_position")
        if self._train_loader is not None and self._resume_position is not None:
            self._train_loader.load_state_dict(self._resume_position)
            self._resume_position = None

    def val_dataloader(self) -> DataLoader:
        return self.dataloader("validation", shuffle=False, batch_size=self.eval_batch_size)

    def test_dataloader(self) -> DataLoader:
        return self.dataloader("test", shuffle=False, batch_size=self.eval_batch_size)
