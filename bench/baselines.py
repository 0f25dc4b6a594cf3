"""Benchmark 8: wall time and peak memory of each `python -m llasmol.baseline` method.

1. The bundled sample's test split (11 tasks, 30 samples each; 300 training samples a task), each method in
   its own process, as a user runs it.
2. A synthetic copy in the official layout with a test split of SMolInstruct's size (33,000 samples over
   the 14 tasks) and a training split scaled down (`--train` samples per non-property task; the property
   tasks at MoleculeNet's sizes, i.e. their full size), from which the full training split is extrapolated
   (`extrapolate`: only nearest_neighbor's cost grows with the non-property training split). Molecules are the
   bundled sample's, made distinct by an added small fragment; names get a prefix; captions are word
   salad of caption length; property labels follow a simple function of the molecule. OPSIN is also
   timed on the test split's names one by one (repeats included), since the method parses each distinct
   name once.

Each run records wall time (process start to exit), the command's own time split (training, answering,
scoring, from baseline.json) and peak resident memory. About 10 minutes on 2 cores, most of it the
fingerprint method's forests (HIV and SIDER at full size) and scoring 33,000 nearest_neighbor answers.

    python bench/baselines.py [--train 10000] [--methods rdkit,opsin,fingerprint,nearest_neighbor]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, SEED, write_result  # noqa: E402

from llasmol.classical.common import Examples  # noqa: E402
from llasmol.classical.morgan import morgan_packed, top_k_similar  # noqa: E402
from llasmol.classical.nearest import NearestNeighbor  # noqa: E402
from llasmol.classical.opsin_names import opsin_smiles  # noqa: E402
from llasmol.core.tasks import TASKS, get_task  # noqa: E402

BUNDLED = ROOT / "llasmol" / "data" / "bundled"
METHODS = ("rdkit", "opsin", "fingerprint", "nearest_neighbor")
TEST_TOTAL = 33_000
# MoleculeNet's molecule counts (ESOL 1,128; Lipophilicity 4,200; BBBP 2,039; ClinTox 1,478; HIV 41,127;
# SIDER 1,427 with 27 side effects), split 8:1 train:test here.
PROPERTY_MOLECULES = {"property_prediction-esol": 1128, "property_prediction-lipo": 4200,
                      "property_prediction-bbbp": 2039, "property_prediction-clintox": 1478,
                      "property_prediction-hiv": 41127, "property_prediction-sider": 1427}
SIDER_TARGETS = 27
# SMolInstruct's training split per task (the paper's Table 1, from the task table; 3.29M in all). Used only
# to extrapolate nearest_neighbor, whose cost grows with the training split.
FULL_TRAIN = {task.name: task.paper_counts[0] for task in TASKS}
# nearest_neighbor.max_train_inputs that the extrapolation also prices (a seeded subset per task).
CAP = 100_000
TEXT_INPUT_TASKS = ("molecule_generation", "name_conversion-i2f", "name_conversion-i2s")
FRAGMENTS = ["C", "CC", "CCC", "O", "N", "CO", "CN", "CCl", "CF", "CBr", "C#N", "CC(C)C", "OC", "NC", "S"]
WORDS = ("molecule is a member of the class of compounds that has role as an metabolite inhibitor agent derived "
         "from acid ester amine aromatic ring substituted by hydroxy methyl group it is functionally related to "
         "conjugate base tautomer natural product found in plant organism with data available").split()
PREFIXES = ["", "2-methyl", "3-ethyl", "4-chloro", "2-fluoro", "N-methyl", "3-hydroxy", "4-amino", "2-bromo",
            "5-nitro", "2,3-dimethyl", "4-methoxy", "3-oxo", "6-propyl", "2-cyano"]


def bundled_pairs(task: str) -> list[tuple[str, str]]:
    pairs = []
    for split in ("train", "dev", "test"):
        for line in (BUNDLED / "raw" / split / f"{task}.jsonl").read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                pairs.append((record["input"], record["output"]))
    return pairs


EXTRAS = [""] + [f".{a}" for a in FRAGMENTS] + [f".{a}.{b}" for a in FRAGMENTS for b in FRAGMENTS if a <= b]


def variant(bases: list[str], i: int) -> tuple[str, str]:
    """The i-th distinct variant of distinct `bases`: (base, an added fragment or '')."""
    if i >= len(bases) * len(EXTRAS):
        raise ValueError(f"only {len(bases) * len(EXTRAS)} variants")
    return bases[i % len(bases)], EXTRAS[i // len(bases)]


def caption(rng: random.Random) -> str:
    return "The " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(30, 70))) + "."


def write_copy(root: Path, train_per_task: int, seed: int = SEED) -> dict[str, dict[str, int]]:
    """The synthetic copy; returns {task: {split: samples}}."""
    rng = random.Random(seed)
    molecules = sorted({x for t in ("name_conversion-s2f", "property_prediction-hiv", "property_prediction-lipo",
                                    "property_prediction-esol", "property_prediction-bbbp") for x, _ in bundled_pairs(t)})
    reactions = bundled_pairs("forward_synthesis")
    names = bundled_pairs("name_conversion-i2s")
    others = [t.name for t in TASKS if t.family not in ("number", "boolean")]  # the generation tasks
    sider_test = PROPERTY_MOLECULES["property_prediction-sider"] // 10 * SIDER_TARGETS
    property_test = sum(n // 10 for t, n in PROPERTY_MOLECULES.items() if t != "property_prediction-sider") + sider_test
    test_other = (TEST_TOTAL - property_test) // len(others)
    counts: dict[str, dict[str, int]] = {}

    def rows(task: str, n: int, offset: int) -> list[tuple[str, object]]:
        """n (input, output) pairs; `offset` keeps train and test inputs apart."""
        if task in ("forward_synthesis", "retrosynthesis"):
            product_of = dict(reactions)
            out = []
            for i in range(offset, offset + n):
                reactants, extra = variant(list(product_of), i)
                product = product_of[reactants]
                out.append((reactants + extra, product) if task == "forward_synthesis" else (product + extra, reactants))
            return out
        if task in ("name_conversion-i2f", "name_conversion-i2s"):
            named = [(f"{p}{'-' if p else ''}{name}", smi) for p in PREFIXES for name, smi in names]
            picked = [named[(offset + i) % len(named)] for i in range(n)]
            return [(x, "C1H4" if task.endswith("i2f") else y) for x, y in picked]
        smiles = ["".join(variant(molecules, i)) for i in range(offset, offset + n)]
        if task == "molecule_captioning":
            return [(s, caption(rng)) for s in smiles]
        if task == "molecule_generation":
            return [(caption(rng), s) for s in smiles]
        if task == "name_conversion-s2f":
            return [(s, "C1H4") for s in smiles]
        if task == "name_conversion-s2i":
            return [(s, f"name of {s}") for s in smiles]
        if task in ("property_prediction-esol", "property_prediction-lipo"):
            return [(s, f"{-0.05 * len(s) + rng.gauss(0, 0.5):.2f}") for s in smiles]
        if task == "property_prediction-sider":
            return [(s, {f"Side effect {k}": "Yes" if (len(s) + k) % 3 else "No" for k in range(SIDER_TARGETS)})
                    for s in smiles]
        return [(s, "Yes" if ("N" in s) != (len(s) % 5 == 0) else "No") for s in smiles]

    for task in others + list(PROPERTY_MOLECULES):
        (root / "core_tag").mkdir(parents=True, exist_ok=True)
        (root / "core_tag" / f"{task}.json").write_text(json.dumps(get_task(task).core_tags()))
        (root / "template" / "instruction_tuning").mkdir(parents=True, exist_ok=True)
        (root / "template" / "instruction_tuning" / f"{task}.json").write_text(
            json.dumps([{"input": "Question about <INPUT> ?", "output": "The answer is <OUTPUT> ."}]))
        if task in PROPERTY_MOLECULES:
            molecules_n = PROPERTY_MOLECULES[task]
            sizes = {"train": molecules_n * 8 // 10, "test": molecules_n // 10, "dev": 5}
        else:
            sizes = {"train": train_per_task, "test": test_other, "dev": 5}
        offset = 0
        counts[task] = {}
        for split in ("test", "dev", "train"):
            pairs = rows(task, sizes[split], offset)
            offset += sizes[split]
            samples = []
            for i, (_, out) in enumerate(pairs):
                for target in (sorted(out) if isinstance(out, dict) else [None]):
                    samples.append({"idx": i, "template_id": 0, "target": target})
            (root / "raw" / split).mkdir(parents=True, exist_ok=True)
            with (root / "raw" / split / f"{task}.jsonl").open("w") as fh:
                fh.writelines(json.dumps({"input": x, "output": y}) + "\n" for x, y in pairs)
            (root / "sample" / "instruction_tuning" / split).mkdir(parents=True, exist_ok=True)
            (root / "sample" / "instruction_tuning" / split / f"{task}.json").write_text(
                json.dumps({"template_name": "instruction_tuning", "samples": samples}))
            counts[task][split] = len(samples)
    return counts


def run_method(method: str, out: Path, *overrides: str) -> dict:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "llasmol.baseline", f"method={method}", f"hydra.run.dir={out}",
                           *overrides], capture_output=True, text=True, cwd=out.parent)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{method} failed:\n{proc.stderr[-3000:]}")
    info = json.loads((out / "baseline.json").read_text())
    metrics = json.loads((out / "metrics" / f"{info['split']}.json").read_text())
    return {"wall_s": round(wall, 2), "seconds": info["seconds"], "peak_rss_mib": info["peak_rss_mib"],
            "tasks": info["tasks"], "train_samples": info["train_samples"], "test_samples": info["test_samples"],
            "metrics": metrics}


def opsin_per_name(root: Path) -> dict:
    """OPSIN on every test name of the I2S and I2F tasks, repeats included, in one call."""

    names = [json.loads(line)["input"] for t in ("name_conversion-i2s", "name_conversion-i2f")
             for line in (root / "raw" / "test" / f"{t}.jsonl").read_text().splitlines()]
    t0 = time.perf_counter()
    parsed = opsin_smiles(names)
    seconds = time.perf_counter() - t0
    return {"names": len(names), "seconds": round(seconds, 2), "ms_per_name": round(1000 * seconds / len(names), 3),
            "parsed": sum(p is not None for p in parsed)}


def unit_costs(root: Path, n_jobs: int = 2) -> dict:
    """What nearest_neighbor's time and memory are made of, per unit, for extrapolating to the full training
    split: a Morgan fingerprint per training molecule, a Tanimoto comparison per (query, training input)
    pair, a TF-IDF fit per training name and a cosine comparison per (query, training name) pair, and the
    memory one task's training data and index take per training sample (tracemalloc: Python and numpy)."""
    import tracemalloc

    import numpy as np
    import torch
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.neighbors import NearestNeighbors

    torch.set_num_threads(n_jobs)
    read = lambda split, task: [json.loads(x) for x in (root / "raw" / split / f"{task}.jsonl").read_text().splitlines()]
    train = [r["input"] for r in read("train", "retrosynthesis")]
    test = [r["input"] for r in read("test", "retrosynthesis")]
    t0 = time.perf_counter()
    table = morgan_packed(train, n_jobs=n_jobs)
    fp_s = time.perf_counter() - t0
    queries = morgan_packed(test, n_jobs=n_jobs)
    t0 = time.perf_counter()
    top_k_similar(queries, table, 10)
    search_s = time.perf_counter() - t0
    names_train = [r["input"] for r in read("train", "name_conversion-i2s")]
    names_test = [r["input"] for r in read("test", "name_conversion-i2s")]
    t0 = time.perf_counter()
    vectorizer = TfidfVectorizer(analyzer="char_wb", ngram_range=(3, 5), sublinear_tf=True, dtype=np.float32)
    index = NearestNeighbors(n_neighbors=5, metric="cosine", algorithm="brute", n_jobs=n_jobs)
    index.fit(vectorizer.fit_transform(names_train))
    fit_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    index.kneighbors(vectorizer.transform(names_test), return_distance=False)
    text_s = time.perf_counter() - t0
    # Memory of one task held for answering: its training samples as read, and the index built on them.
    rows = read("train", "retrosynthesis")
    del table, queries, index, vectorizer
    tracemalloc.start()
    examples = Examples()
    for r in rows:
        examples.add(r["input"], r["output"], None)
    method = NearestNeighbor({"radius": 2, "n_bits": 2048, "text_ngrams": [3, 5]}, n_jobs=1)
    method.fit("retrosynthesis", examples)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {
        "fingerprint_us_per_molecule": round(1e6 * fp_s / len(train), 1),
        "tanimoto_ns_per_pair": round(1e9 * search_s / (len(train) * len(test)), 2),
        "tfidf_fit_us_per_name": round(1e6 * fit_s / len(names_train), 1),
        "tfidf_ns_per_pair": round(1e9 * text_s / (len(names_train) * len(names_test)), 2),
        "bytes_per_train_sample": round(peak / len(rows)),
        "molecules": len(train), "queries": len(test), "names": len(names_train), "name_queries": len(names_test),
    }


def extrapolate(result: dict) -> dict:
    """Each method on the full test split with SMolInstruct's full training split. rdkit, opsin and
    fingerprint are the synthetic runs as measured: their test split is full size, and fingerprint's
    training split (the property tasks) is too. nearest_neighbor: its training phase (reading the split,
    fingerprints, TF-IDF) scaled linearly with the training samples; its answering phase plus the measured
    cost per (query, training input) pair times the added pairs (Tanimoto for SMILES inputs, TF-IDF cosine
    for text; every training sample counted, an upper bound as repeated inputs are indexed once); scoring as
    measured (same test split); peak memory plus the measured bytes per training sample times the growth of
    the largest task, the one task whose data and index are held at a time."""
    out = {}
    for method, run in result["synthetic"].items():
        out[method] = {"total_s": run["seconds"]["total"], "wall_s": run["wall_s"],
                       "peak_rss_mib": run["peak_rss_mib"], "measured": True}
    nn = result["synthetic"].get("nearest_neighbor")
    units = result.get("unit_costs")
    if nn is None or units is None:
        return out
    test, train = nn["test_samples"], nn["train_samples"]
    for cap in (None, CAP):
        full = {t: n if cap is None else min(n, cap) for t, n in FULL_TRAIN.items()}
        # Training reads every sample even under a cap: scaled with all of them (an upper bound when capped).
        train_s = nn["seconds"]["train"] * sum(FULL_TRAIN.values()) / sum(train.values())
        added = {kind: sum((full[t] - train[t]) * test[t] for t in train
                           if (t in TEXT_INPUT_TASKS) == (kind == "text")) for kind in ("smiles", "text")}
        answer_s = (nn["seconds"]["answer"] + 1e-9 * units["tanimoto_ns_per_pair"] * added["smiles"]
                    + 1e-9 * units["tfidf_ns_per_pair"] * added["text"])
        total_s = train_s + answer_s + nn["seconds"]["score"]
        growth = max(FULL_TRAIN.values()) - max(train.values())
        out["nearest_neighbor" if cap is None else f"nearest_neighbor max_train_inputs={cap}"] = {
            "train_s": round(train_s), "answer_s": round(answer_s), "score_s": nn["seconds"]["score"],
            "total_s": round(total_s), "wall_s": round(total_s + nn["wall_s"] - nn["seconds"]["total"]),
            "peak_rss_mib": round(nn["peak_rss_mib"] + units["bytes_per_train_sample"] * growth / 2**20),
            "added_pairs": added, "full_train_samples": sum(full.values()), "measured": False,
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--train", type=int, default=10_000, help="training samples per non-property task")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--skip-sample", action="store_true")
    args = parser.parse_args()
    methods = args.methods.split(",")
    result: dict = {"train_per_task": args.train, "test_total_target": TEST_TOTAL}
    with tempfile.TemporaryDirectory(prefix="llasmol-baselines-") as tmp:
        tmp = Path(tmp)
        if not args.skip_sample:
            result["sample"] = {}
            for method in methods:
                r = run_method(method, tmp / f"sample-{method}")
                result["sample"][method] = r
                print(f"sample  {method:17s} wall {r['wall_s']:6.1f}s  in-command {r['seconds']['total']:6.1f}s  "
                      f"peak {r['peak_rss_mib']:6.0f} MiB", flush=True)
        t0 = time.perf_counter()
        counts = write_copy(tmp / "synthetic", args.train)
        result["synthetic_counts"] = counts
        result["synthetic_write_s"] = round(time.perf_counter() - t0, 1)
        test_total = sum(c["test"] for c in counts.values())
        print(f"synthetic copy: {test_total} test samples, {sum(c['train'] for c in counts.values())} train samples "
              f"({result['synthetic_write_s']}s to write)", flush=True)
        result["synthetic"] = {}
        for method in methods:
            r = run_method(method, tmp / f"synthetic-{method}", f"data.path={tmp / 'synthetic'}")
            r.pop("metrics")  # scores of synthetic data mean nothing
            result["synthetic"][method] = r
            print(f"synthetic {method:17s} wall {r['wall_s']:6.1f}s  {json.dumps(r['seconds'])}  "
                  f"peak {r['peak_rss_mib']:6.0f} MiB", flush=True)
        if "opsin" in methods:
            result["opsin_per_name"] = opsin_per_name(tmp / "synthetic")
            print(f"OPSIN: {result['opsin_per_name']}", flush=True)
        if "nearest_neighbor" in methods:
            result["unit_costs"] = unit_costs(tmp / "synthetic")
            print(f"unit costs: {result['unit_costs']}", flush=True)
        result["full_split_estimate"] = extrapolate(result)
        for method, e in result["full_split_estimate"].items():
            print(f"full split {method:40s} {'measured' if e['measured'] else 'extrapolated'}: "
                  f"wall {e['wall_s']:7.0f}s  peak {e['peak_rss_mib']:6.0f} MiB", flush=True)
    write_result("baselines", result)


if __name__ == "__main__":
    main()
