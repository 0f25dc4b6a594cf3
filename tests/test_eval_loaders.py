"""The validation and test loaders: every sample once, in file order, at the evaluation batch size, and never
resumed mid-epoch (only training remembers its place)."""

from __future__ import annotations

import pytest
from torch.utils.data import DataLoader

from llasmol.data.resumable_loader import ResumableDataLoader
from test_data import make_dm, tokenizer  # noqa: F401  (the module's tokenizer fixture)


@pytest.mark.parametrize("split, loader_of", [("validation", "val_dataloader"), ("test", "test_dataloader")])
def test_evaluation_loaders_read_their_split_whole_in_order(tokenizer, smol_root, split, loader_of):  # noqa: F811
    dm = make_dm(tokenizer, smol_root, micro_batch_size=2, eval_batch_size=3, seed=5)
    loader = getattr(dm, loader_of)()
    assert type(loader) is DataLoader and not isinstance(loader, ResumableDataLoader)
    assert loader.batch_size == 3
    order = list(iter(loader.sampler))
    assert order == list(range(len(dm.split(split))))  # unshuffled, whatever the seed
    assert len(loader) == -(-len(order) // 3)
    train = dm.train_dataloader()
    assert isinstance(train, ResumableDataLoader) and train.batch_size == 2
    assert list(iter(train.sampler)) != list(range(len(dm.split("train"))))  # training is shuffled
