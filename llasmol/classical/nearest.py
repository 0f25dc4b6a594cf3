"""`method=nearest_neighbor`: answer with the training answers of the most similar training inputs.

Every task has a row: SMILES inputs (reactions as their '.'-joined molecules, so forward synthesis compares
reactant sets) by Tanimoto similarity of Morgan fingerprints (`llasmol.classical.morgan`); IUPAC names and
molecule descriptions by cosine similarity of TF-IDF character n-grams. Training samples that share an input
are one entry carrying all their answers; top-k answers come from the k nearest entries, nearest first,
each answer once; a training input identical to the query comes first. SIDER looks among the training
samples of the same side effect only.
"""

from __future__ import annotations

import logging
from typing import Optional

import numpy as np

from llasmol.classical.common import Baseline, Examples
from llasmol.classical.morgan import morgan_packed, top_k_similar
from llasmol.core.tasks import Task

log = logging.getLogger(__name__)


class _Index:
    """The unique training inputs of one task and target: their features and their answers."""

    def __init__(self, inputs: list[str], answers: list[list[str]], features) -> None:
        self.inputs, self.answers, self.features = inputs, answers, features


class NearestNeighbor(Baseline):
    name = "nearest_neighbor"
    needs_training = True
    shared_settings = ("morgan",)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._indexes: dict[str, dict[Optional[str], _Index]] = {}
        self._vectorizers: dict[tuple[str, Optional[str]], object] = {}

    def why_not(self, task: Task) -> Optional[str]:
        return None  # every input is a SMILES or a text

    # -- features ------------------------------------------------------------------------------
    def _molecules(self, inputs: list[str]) -> np.ndarray:
        return morgan_packed(inputs, self.settings["radius"], self.settings["n_bits"], self.n_jobs)

    def _fit_text(self, key: tuple[str, Optional[str]], inputs: list[str]):
        from sklearn.feature_extraction.text import TfidfVectorizer

        low, high = self.settings["text_ngrams"]
        vectorizer = TfidfVectorizer(analyzer="char_wb", ngram_range=(int(low), int(high)), sublinear_tf=True,
                                     dtype=np.float32)
        self._vectorizers[key] = vectorizer
        return vectorizer.fit_transform(inputs)

    # -- learning and answering ----------------------------------------------------------------
    def fit(self, task: str, train: Examples) -> None:
        smiles = self.tasks.task(task).input_kind == "smiles"
        cap = self.settings.get("max_train_inputs")
        self._indexes[task] = {}
        for target, rows in train.groups().items():
            answers_of: dict[str, list[str]] = {}
            for i in rows:
                bucket = answers_of.setdefault(train.inputs[i], [])
                if train.answers[i] not in bucket:
                    bucket.append(train.answers[i])
            inputs = list(answers_of)
            if cap and len(inputs) > cap:  # a seeded subset bounds time and memory on very large splits
                keep = np.sort(np.random.default_rng([self.seed, len(inputs)]).choice(len(inputs), cap, replace=False))
                inputs = [inputs[i] for i in keep]
            features = self._molecules(inputs) if smiles else self._fit_text((task, target), inputs)
            self._indexes[task][target] = _Index(inputs, [answers_of[x] for x in inputs], features)
        log.info("nearest_neighbor: %s indexes %d distinct training inputs", task,
                 sum(len(ix.inputs) for ix in self._indexes[task].values()))

    def _neighbours(self, task: str, target: Optional[str], index: _Index, queries: list[str], k: int) -> np.ndarray:
        if self.tasks.task(task).input_kind == "smiles":
            rows, _ = top_k_similar(self._molecules(queries), index.features, k,
                                    table_rows=int(self.settings.get("table_rows", 8192)))
            return rows
        from sklearn.neighbors import NearestNeighbors

        search = NearestNeighbors(n_neighbors=min(k, len(index.inputs)), metric="cosine", algorithm="brute",
                                  n_jobs=self.n_jobs).fit(index.features)
        return search.kneighbors(self._vectorizers[(task, target)].transform(queries), return_distance=False)

    def forget(self, task: str) -> None:
        self._indexes.pop(task, None)
        for key in [key for key in self._vectorizers if key[0] == task]:
            del self._vectorizers[key]

    def predict(self, task: str, test: Examples, k: int) -> list[list[str]]:
        out: list[list[str]] = [[] for _ in range(len(test))]
        for target, rows in test.groups().items():
            index = self._indexes.get(task, {}).get(target)
            if index is None or not index.inputs:
                log.warning("nearest_neighbor: no training sample of %s with target %r: %d samples unanswered",
                            task, target, len(rows))
                continue
            neighbours = self._neighbours(task, target, index, [test.inputs[i] for i in rows], k)
            position = {x: j for j, x in enumerate(index.inputs)}
            for i, found in zip(rows, neighbours):
                # The same input seen in training is the nearest of all, ahead of look-alikes with equal
                # similarity (stereoisomers share a Morgan fingerprint).
                same = position.get(test.inputs[i])
                if same is not None:
                    found = [same] + [j for j in found if j != same][: k - 1]
                answers: list[str] = []
                for j in found:
                    answers.extend(a for a in index.answers[j] if a not in answers)
                out[i] = answers[:k]
        return out
