"""Deterministic, rank-aware sample order.

Lightning's automatic DistributedSampler is switched off (`use_distributed_sampler: false` in every
trainer preset) so that this one sampler owns the order: the same seed gives the same order on any number
of devices, each rank takes a disjoint stride of it, and DataLoader workers split a rank's batches between
them, so every (rank, worker) pair sees disjoint samples.
"""

from __future__ import annotations

from typing import Iterator, Optional

import numpy as np
import torch.distributed as dist
from torch.utils.data import Sampler


PADDING = -1  # the position that pads an evaluation share to the others' length (no sample, no loss)


def draws(count: int, weight: float) -> tuple[int, int]:
    """(times every one of `count` positions is drawn, positions drawn once more) in an epoch at `weight`: 2.5
    draws each twice and a half of them once more; a positive weight draws at least one."""
    whole = int(weight)
    extra = round((weight - whole) * count)
    return whole, max(extra, 1 if count and weight > 0 and not whole else 0)


def _dist_rank_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class ShardedShuffleSampler(Sampler[int]):
    """Shuffles `range(num_samples)` from `seed + epoch` and gives rank `r` the positions r, r+W, ...

    With `even=True` (training) every rank gets the same count, so DDP steps stay in lock-step; the at most
    W-1 samples left over change from epoch to epoch because the order does. With `even=False` (evaluation)
    every sample is seen exactly once across ranks, and a rank whose share is one short ends it with `PADDING`,
    which the dataset serves as a row without loss: every rank runs as many batches as the others (under
    trainer=fsdp a forward is collective, and a rank with a batch fewer would leave the others waiting).
    """

    def __init__(
        self,
        num_samples: int,
        seed: Optional[int] = None,
        shuffle: bool = True,
        rank: int | None = None,
        world_size: int | None = None,
        even: bool = True,
        lengths: Optional[np.ndarray] = None,
        batch_size: int = 1,
        group_window: int = 64,
        weights: Optional[list[tuple[int, int, float]]] = None,
    ) -> None:
        """`weights`: (start, end, weight) blocks of positions (a task's samples) drawn `weight` times an epoch:
        2 twice each, 0.5 a half of them drawn anew each epoch; None: every position once."""
        if rank is None or world_size is None:
            rank, world_size = _dist_rank_world()
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world of size {world_size}")
        if shuffle and seed is None:
            raise ValueError("a shuffled order needs a seed (the config's `seed`)")
        self.num_samples = num_samples
        self.seed = seed
        self.shuffle = shuffle
        self.rank = rank
        self.world_size = world_size
        self.even = even
        self.lengths = lengths
        self.batch_size = batch_size
        self.group_window = group_window
        self.weights = weights
        self.epoch_samples = num_samples if weights is None else sum(
            whole * (end - start) + extra for start, end, w in weights for whole, extra in [draws(end - start, w)])
        self.epoch = 0
        self.start = 0  # positions of this epoch's share to skip once (resuming mid-epoch)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _order(self) -> np.ndarray:
        # int32 when it fits: half the memory of `permutation`'s int64, and the same shuffle (permutation
        # is arange + shuffle).
        dtype = np.int32 if self.num_samples < 2**31 else np.int64
        order = np.arange(self.num_samples, dtype=dtype) if self.weights is None else self._weighted(dtype)
        if self.shuffle:
            np.random.default_rng([self.seed, self.epoch]).shuffle(order)
        return order

    def _weighted(self, dtype) -> np.ndarray:
        """Each block's positions `int(weight)` times, and a fresh draw of the fraction left (`data.weights`)."""
        rng = np.random.default_rng([self.seed, self.epoch, 2])  # weights come with a shuffle, and so a seed
        parts = []
        for start, end, weight in self.weights:
            positions = np.arange(start, end, dtype=dtype)
            whole, drawn = draws(len(positions), weight)
            parts.extend([positions] * whole)
            if drawn:
                parts.append(np.sort(rng.choice(positions, drawn, replace=False)))
        return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)

    def __iter__(self) -> Iterator[int]:
        order = self._order()
        if self.even:
            order = order[: len(order) - len(order) % self.world_size]
        share = order[self.rank :: self.world_size]
        if self.lengths is not None and self.shuffle and self.batch_size > 1:
            share = self._group_by_length(share)
        elif not self.even and len(share) < len(self):
            share = np.append(share, PADDING)
        start, self.start = self.start, 0
        # One int at a time from the array: a list of the epoch's order would cost ~36 bytes a sample.
        return map(int, share[start:])

    def _group_by_length(self, share: np.ndarray) -> np.ndarray:
        """Within each window of `group_window` micro-batches of the shuffled share, sort by length and cut
        into micro-batches, then shuffle those batches: each batch pads little, the epoch's samples and
        their rough order stay those of the shuffle."""
        rng = np.random.default_rng([self.seed, self.epoch, self.rank, 1])
        window = self.batch_size * self.group_window
        out = np.empty_like(share)
        for start in range(0, len(share), window):
            chunk = share[start : start + window]
            chunk = chunk[np.argsort(-self.lengths[chunk], kind="stable")]
            full = len(chunk) // self.batch_size
            batches = chunk[: full * self.batch_size].reshape(full, self.batch_size)
            out[start : start + full * self.batch_size] = batches[rng.permutation(full)].ravel()
            # A short final batch stays last, so every other batch is full.
            out[start + full * self.batch_size : start + len(chunk)] = chunk[full * self.batch_size :]
        return out

    def __len__(self) -> int:
        # The whole epoch, even while resuming: the trainer counts the skipped batches as done already.
        if self.even:
            return self.epoch_samples // self.world_size
        return -(-self.epoch_samples // self.world_size)  # every rank's share, padded to the longest
