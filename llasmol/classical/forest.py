"""`method=fingerprint`: Morgan fingerprints and a random forest per property, MoleculeNet's classic baseline.

Regression for the number tasks (ESOL, Lipophilicity), classification for the yes/no tasks (BBBP, ClinTox,
HIV, and SIDER with one classifier per side effect: a sample's `target`), trained on the train split's
labels as the scorer reads them (`parse_number`, `parse_boolean`). Seeded from the config's seed.
"""

from __future__ import annotations

import logging
import zlib
from typing import Optional

import numpy as np

from llasmol.classical.common import Baseline, Examples
from llasmol.classical.morgan import morgan_packed
from llasmol.core.tasks import Task
from llasmol.metrics.families import parse_boolean, parse_number

log = logging.getLogger(__name__)

_PROPERTY_FAMILIES = ("number", "boolean")


class FingerprintForest(Baseline):
    name = "fingerprint"
    needs_training = True
    shared_settings = ("morgan",)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._models: dict[str, dict[Optional[str], object]] = {}

    def why_not(self, task: Task) -> Optional[str]:
        if task.family not in _PROPERTY_FAMILIES or task.input_kind != "smiles":
            return "it predicts properties of a SMILES input (numbers, yes/no) only"
        return None

    def _features(self, smiles: list[str]) -> np.ndarray:
        packed = morgan_packed(smiles, self.settings["radius"], self.settings["n_bits"], self.n_jobs)
        return np.unpackbits(packed, axis=1)  # one uint8 column per bit

    def _forest(self, regression: bool, target: Optional[str]):
        from sklearn.ensemble import RandomForestClassifier, RandomForestRegressor

        cls = RandomForestRegressor if regression else RandomForestClassifier
        # One seed per side effect, so adding a target does not change the others' forests.
        seed = int(np.random.default_rng([self.seed, zlib.crc32((target or "").encode())]).integers(2**31))
        return cls(n_estimators=int(self.settings["n_estimators"]), max_features=self.settings["max_features"],
                   min_samples_leaf=int(self.settings["min_samples_leaf"]), n_jobs=self.n_jobs, random_state=seed)

    def fit(self, task: str, train: Examples) -> None:
        regression = self.tasks.task(task).family == "number"
        parse = parse_number if regression else parse_boolean
        self._models[task] = {}
        for target, rows in train.groups().items():
            labelled = [(train.inputs[i], label) for i in rows if (label := parse(train.answers[i])) is not None]
            if len(labelled) < len(rows):
                log.warning("fingerprint: %s: %d training labels are not %s; left out", task,
                            len(rows) - len(labelled), "numbers" if regression else "yes/no")
            if not labelled:
                continue
            forest = self._forest(regression, target)
            forest.fit(self._features([x for x, _ in labelled]), np.asarray([y for _, y in labelled]))
            self._models[task][target] = forest
        log.info("fingerprint: %s: %d forest(s) on %d training samples", task, len(self._models[task]), len(train))

    def forget(self, task: str) -> None:
        self._models.pop(task, None)

    def predict(self, task: str, test: Examples, k: int) -> list[list[str]]:
        regression = self.tasks.task(task).family == "number"
        out: list[list[str]] = [[] for _ in range(len(test))]
        for target, rows in test.groups().items():
            forest = self._models.get(task, {}).get(target)
            if forest is None:
                log.warning("fingerprint: no training label of %s for target %r: %d samples unanswered",
                            task, target, len(rows))
                continue
            predicted = forest.predict(self._features([test.inputs[i] for i in rows]))
            for i, value in zip(rows, predicted):
                # Two decimals, as the golds are written; the classifier's labels are the golds' Yes / No.
                out[i] = [f"{float(value):.2f}" if regression else str(value)]
        return out
