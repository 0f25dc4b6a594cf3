"""A training DataLoader that remembers its place in the epoch, so a resumed run continues from there.

Its state is the epoch and the number of micro-batches served in it. The DataModule puts that state in
every checkpoint and hands it back before the resumed run's first batch (see `SMolInstructDataModule.
state_dict`); the sampler then skips exactly those positions of the epoch's deterministic order, so no
sample is seen twice or missed, on one device or many. Having `state_dict`/`load_state_dict` also tells
Lightning that the loader is resumable mid-epoch.
"""

from __future__ import annotations

from typing import Any, Iterator

from torch.utils.data import DataLoader

from llasmol.data.sampler import ShardedShuffleSampler
from llasmol.core.errors import UserError


class ResumableDataLoader(DataLoader):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not isinstance(self.sampler, ShardedShuffleSampler):
            raise TypeError("ResumableDataLoader needs a ShardedShuffleSampler")
        self._epoch = self.sampler.epoch
        self._served = 0
        self._pending: dict | None = None

    def _shape(self) -> dict:
        """What the saved position means: the same numbers must hold when it is restored."""
        s = self.sampler
        return {"num_samples": s.num_samples, "batch_size": self.batch_size, "world_size": s.world_size,
                "seed": s.seed, "group_by_length": s.lengths is not None,
                "weights": None if s.weights is None else [list(block) for block in s.weights]}

    def state_dict(self) -> dict:
        return {"epoch": self._epoch, "batches": self._served, **self._shape()}

    def load_state_dict(self, state: dict) -> None:
        saved = {k: state.get(k) for k in self._shape()}
        if saved != self._shape():
            changed = ", ".join(f"{k} {saved[k]} -> {v}" for k, v in self._shape().items() if saved[k] != v)
            raise UserError(
                f"cannot resume at the checkpoint's data position: the training data changed ({changed}); "
                "resume with the run's data, seed, micro-batch size and device count, or start a new run"
            )
        self._pending = state

    def __iter__(self) -> Iterator:
        # A generator: the body runs at the first batch, after the trainer has set the sampler's epoch.
        epoch = self.sampler.epoch
        skip = 0
        if self._pending is not None and self._pending["epoch"] == epoch:
            skip = self._pending["batches"]
        self._pending = None
        self.sampler.start = skip * self.batch_size
        self._epoch, self._served = epoch, skip
        for batch in super().__iter__():
            self._served += 1
            yield batch
