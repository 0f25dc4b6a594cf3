"""Benchmark 3: scoring 10,000 predictions across all tasks, against a straightforward scorer.

Records are synthesized from the bundled sample (every split's raw files): golds are the raw outputs
(pooled over records that share a task and input), each record has the paper's number of returned
sequences for its task (conf/generation/paper.yaml), and predictions mix correct answers (30%: the gold,
or for SMILES 30% of the time a random other spelling of it), wrong-but-valid answers (45%: another
record's gold, or for SMILES half the time a near miss, that gold with one more carbon), invalid answers
(15%) and untagged text (10%). Captioning is not in the sample, so it is not scored here.

The baseline, written here, re-parses every gold with RDKit for every prediction it is compared with
(no caching); ours is `llasmol.metrics.scoring.score_records` (its gold cache cleared before each run).
The two alternate in rounds so both see the same machine load; exact-match numbers must agree.

    python bench/scoring.py [--records 10000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, compose_config, write_result  # noqa: E402
from llasmol.core.tasks import get_task  # noqa: E402
from llasmol.inference.beam_search import task_settings  # noqa: E402
from llasmol.metrics import molecules  # noqa: E402
from llasmol.metrics.extract import extract_answer  # noqa: E402
from llasmol.metrics.formula import parse_formula  # noqa: E402
from llasmol.metrics.scoring import score_records  # noqa: E402

BUNDLED = ROOT / "llasmol" / "data" / "bundled"


# --------------------------------------------------------------------------- synthetic records


def load_golds() -> dict[str, list[tuple[str, str]]]:
    pairs: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for path in sorted((BUNDLED / "raw").glob("*/*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                if isinstance(rec["output"], str):
                    pairs[path.stem].append((rec["input"], rec["output"]))
    return pairs


def synthesize(n: int, seed: int = 0) -> list[dict]:
    from rdkit import Chem

    gen_cfg = compose_config(["generation=paper"]).generation
    rng = random.Random(seed)
    pairs = load_golds()
    tasks = sorted(pairs)
    records = []
    for r in range(n):
        task = tasks[r % len(tasks)]
        tag = get_task(task).answer_tag
        inp, gold = rng.choice(pairs[task])
        k = task_settings(gen_cfg, task).num_return_sequences

        def correct() -> str:
            if tag == "SMILES" and rng.random() < 0.3:  # another spelling of the same molecule
                mol = Chem.MolFromSmiles(gold)
                if mol is not None:
                    return Chem.MolToSmiles(mol, doRandom=True, canonical=False)
            return gold

        def wrong() -> str:
            other = rng.choice(pairs[task])[1]
            if tag == "SMILES" and rng.random() < 0.5:  # a near miss: one more carbon (mostly valid)
                return other + "C"
            return other  # another sample's gold

        def invalid() -> str:
            return {"SMILES": "C1CC(N", "MOLFORMULA": "Xq2", "NUMBER": "n/a", "BOOLEAN": "maybe",
                    "IUPAC": ""}.get(tag, "???")

        predictions = []
        for j in range(k):
            kind = rng.choices(["correct", "wrong", "invalid", "untagged"], [0.3, 0.45, 0.15, 0.1])[0]
            answer = {"correct": correct, "wrong": wrong, "invalid": invalid, "untagged": wrong}[kind]()
            if kind == "untagged":
                predictions.append(f"The answer is {answer} .")
            else:
                predictions.append(f"The answer is <{tag}> {answer} </{tag}> .")
        records.append({"task": task, "input": inp, "gold": gold, "predictions": predictions})
    return records


# --------------------------------------------------------------------------- the straightforward baseline


def _mols(text):
    """RDKit molecules of a SMILES answer (';' as '.'), or None when invalid: parsed anew every call."""
    from rdkit import Chem

    if not text:
        return None
    parts = [p.strip() for p in text.replace(";", ".").split(".")]
    mols = []
    for part in parts:
        if not part or any(c.isspace() for c in part):
            return None
        mol = Chem.MolFromSmiles(part)
        if mol is None or mol.GetNumAtoms() == 0:
            return None
        mols.append(mol)
    return mols


def _inchis(mols) -> frozenset:
    from rdkit import Chem

    keys = set()
    for mol in mols:
        try:
            key = Chem.MolToInchi(mol)
        except Exception:
            key = ""
        keys.add(key or "smiles:" + Chem.MolToSmiles(mol))
    return frozenset(keys)


def _fps(text):
    from rdkit import Chem
    from rdkit.Chem import MACCSkeys, rdFingerprintGenerator

    mol = Chem.MolFromSmiles(text.replace(";", "."))
    gen = rdFingerprintGenerator.GetMorganGenerator(radius=2)
    return (gen.GetSparseCountFingerprint(mol), MACCSkeys.GenMACCSKeys(mol), Chem.RDKFingerprint(mol))


def baseline_score(records: list[dict]) -> dict[str, dict[str, float]]:
    from rdkit import DataStructs

    golds = defaultdict(list)
    for rec in records:
        bucket = golds[(rec["task"], rec["input"])]
        if rec["gold"] not in bucket:
            bucket.append(rec["gold"])
    sums: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for rec in records:
        task = rec["task"]
        family = get_task(task).family
        s = sums[task]
        s["n"] += 1
        gs = [g.strip() for g in golds[(task, rec["input"])]]
        answers = [extract_answer(task, p) for p in rec["predictions"]]
        hits = []
        for i, answer in enumerate(answers[:10]):
            hit = False
            if answer is None:
                pass
            elif family == "smiles":
                mols = _mols(answer)
                if mols is not None:
                    key = _inchis(mols)
                    for g in gs:  # every gold parsed again for every prediction
                        gm = _mols(g)
                        if gm is not None and _inchis(gm) == key:
                            hit = True
                    if i == 0:
                        s["valid"] += 1
                        fp = _fps(answer)
                        best = [0.0, 0.0, 0.0]
                        for g in gs:
                            if _mols(g) is None:
                                continue
                            gfp = _fps(g)
                            for f in range(3):
                                best[f] = max(best[f], DataStructs.TanimotoSimilarity(fp[f], gfp[f]))
                        s["fts"] += best[0]
            elif family == "formula":
                p = parse_formula(answer)
                hit = p is not None and any(parse_formula(g) == p for g in gs)
            elif family == "iupac":
                key = frozenset(x.strip() for x in answer.split(";")) - {""}
                hit = bool(key) and any((frozenset(x.strip() for x in g.split(";")) - {""}) == key for g in gs)
            elif family == "number":
                if i == 0:
                    try:
                        v = float(answer.strip().replace("\u2212", "-"))
                    except ValueError:
                        v = math.nan
                    if math.isfinite(v):
                        s["valid"] += 1
                        s["sq"] += min((v - float(g)) ** 2 for g in gs)
            else:  # yes/no
                if i == 0:
                    word = answer.strip().lower()
                    hit = word in ("yes", "no") and any(word == g.strip().lower() for g in gs)
            hits.append(hit)
        for k in (1, 3, 5, 10):
            s[f"top{k}"] += any(hits[:k])
    out = {}
    for task, s in sums.items():
        n, family = s["n"], get_task(task).family
        m = {"exact_match": s["top1"] / n}
        m.update({f"top{k}_exact_match": s[f"top{k}"] / n for k in (3, 5, 10)})
        if family == "smiles":
            m["fts"] = s["fts"] / s["valid"] if s["valid"] else 0.0
        if family == "number":
            m = {"rmse": math.sqrt(s["sq"] / s["valid"]) if s["valid"] else math.nan}
        elif family == "boolean":
            m = {"accuracy": s["top1"] / n}
        out[task] = m
    return out


def _compare(base: dict, ours: dict) -> list[str]:
    diffs = []
    for task, metrics in base.items():
        for name, value in metrics.items():
            if name not in ours[task]:
                continue  # top-k beyond the task's returned sequences is not reported by ours
            if not math.isclose(value, ours[task][name], rel_tol=1e-9, abs_tol=1e-9):
                diffs.append(f"{task}/{name}: baseline {value} ours {ours[task][name]}")
    return diffs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)

    records = synthesize(args.records)
    print(f"{len(records)} records over {len({r['task'] for r in records})} tasks, "
          f"{sum(len(r['predictions']) for r in records)} predictions", flush=True)
    times = {"baseline": [], "ours": []}
    results = {}
    for rnd in range(args.rounds):
        order = ["baseline", "ours"] if rnd % 2 == 0 else ["ours", "baseline"]
        for name in order:
            molecules.parse_gold_molecule.cache_clear()
            t0 = time.perf_counter()
            results[name] = baseline_score(records) if name == "baseline" else score_records(records)
            times[name].append(time.perf_counter() - t0)
            if name == "ours":
                caches = {"parse_gold_molecule": molecules.parse_gold_molecule.cache_info()._asdict()}
            print(f"round {rnd + 1} {name}: {times[name][-1]:.2f}s", flush=True)
    print("caches after a run of ours:", caches)
    diffs = _compare(results["baseline"], results["ours"])
    base, ours = min(times["baseline"]), min(times["ours"])
    ratio = base / ours
    print(f"baseline (re-parse every gold per prediction): {base:.2f}s")
    print(f"ours (score_records): {ours:.2f}s")
    print(f"ratio: {ratio:.2f}x (target >= 3x)  same exact-match (and FTS, accuracy, RMSE) numbers: {not diffs}")
    for d in diffs[:20]:
        print("  DIFF", d)
    write_result("scoring", {
        "records": len(records), "predictions": sum(len(r["predictions"]) for r in records),
        "baseline": {"what": "bench re-parse scorer (no cache)", "seconds": base, "all_rounds": times["baseline"]},
        "ours": {"what": "llasmol.metrics.scoring.score_records", "seconds": ours, "all_rounds": times["ours"]},
        "ratio": ratio, "target": 3.0, "met": ratio >= 3.0 and not diffs, "same_numbers": not diffs,
        "differences": diffs, "caches": caches, "exact_match_ours": {t: m.get("exact_match", m.get("accuracy")) for t, m in results["ours"].items()},
    })


if __name__ == "__main__":
    main()
