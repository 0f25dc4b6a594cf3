"""Benchmark 8: time and peak memory of `python -m llasmol.audit` on a synthetic full-size SMolInstruct.

A synthetic copy in the official layout (raw/, sample/instruction_tuning/, template/, core_tag/) is
written to a temporary folder with every task's train/dev/test counts of the paper's Table 1 times
--scale (1.0: 3,342,414 samples, `llasmol.core.tasks`). Its molecules are distinct drug-sized ones
(a phenyl ring and eight substituted carbons, 25-35 heavy atoms), so the audit computes about as many
InChIs as on the real data: FS/RS are amide couplings (a distinct acid and product per reaction, a few
amines and reagents shared by all), each reaction in one split of both tasks; NC, MC/MG and property tasks
have their own molecules, split per molecule; SIDER has one raw line per molecule with 20 side effects
(20 samples). The copy is clean, so the audit must pass.

Each size runs the real command in a fresh process (`python -m llasmol.audit data.path=<copy> workers=N`);
its wall time and peak resident memory are reported: ru_maxrss of the largest process, and the sum over
the audit and its workers sampled every 0.2 s (with psutil).

    python bench/audit_scale.py --scale 0.01 --scale 1.0            # workers=1: one process
    python bench/audit_scale.py --scale 0.05 --workers 1 --workers 2 --name audit_workers

Where the full size does not fit the time at hand (about 15 minutes of InChI on one core), run two or more
smaller scales: for each worker count the result also holds a straight-line fit of time and peak memory
against samples, read at the full size (`extrapolated`), marked as such.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, write_result  # noqa: E402

from llasmol.core.tasks import REACTION, TASKS, get_task  # noqa: E402

SUBSTITUENTS = ["C", "O", "N", "F", "Cl", "OC", "C#N", "C(F)(F)F"]
AMINES = ["NC", "NCC", "NCCC", "NC(C)C"]
REAGENTS = ["CCN(CC)CC", "ClCCl", "CN(C)C=O", "O", "O=C(O)O", "CCOC(C)=O"]
SPLITS = (("train", 0), ("dev", 1), ("test", 2))
SIDE_EFFECTS = [f"Side effect {i}" for i in range(20)]


def scaffold(n: int, cap: str) -> str:
    """A distinct molecule for every n < 8**8: substituents on eight carbons in a fixed order."""
    digits = [(n >> (3 * i)) & 7 for i in range(8)]
    return "c1ccc(cc1)" + "".join(f"C({SUBSTITUENTS[d]})" for d in digits) + cap


def reaction(n: int) -> tuple[str, str, str]:
    """(forward input, product, retrosynthesis output) of reaction n: an amide coupling."""
    amine = AMINES[n % len(AMINES)]
    acid, product = scaffold(n, "C(=O)O"), scaffold(n, "C(=O)" + amine)
    reactants = sorted([acid, amine])
    reagents = REAGENTS[n % len(REAGENTS): n % len(REAGENTS) + 1 + n % 2]
    return ".".join(sorted(reactants + reagents)), product, ".".join(reactants)


def record(task: str, n: int) -> tuple[object, object]:
    """The raw (input, output) of molecule or reaction n of `task`."""
    if get_task(task).split_group == REACTION:
        forward, product, reactants = reaction(n)
        return (forward, product) if task == "forward_synthesis" else (product, reactants)
    if task.startswith("name_conversion"):
        smiles, name, formula = scaffold(n, "CO"), f"synthetic-name-{n}", f"C{20 + n % 9}H{24 + n % 11}O3"
        return {"i2f": (name, formula), "i2s": (name, smiles), "s2f": (smiles, formula), "s2i": (smiles, name)}[task[-3:]]
    if task.startswith("molecule_"):
        smiles = scaffold(n, "CN")
        caption = f"The molecule is synthetic compound {n}, an amine with eight substituted carbons and a phenyl group."
        return (smiles, caption) if task == "molecule_captioning" else (caption, smiles)
    smiles = scaffold(n, "CS")  # property tasks: molecules of their own (no task relates them)
    if task.endswith("sider"):
        return smiles, {effect: "Yes" if (n + i) % 3 else "No" for i, effect in enumerate(SIDE_EFFECTS)}
    return smiles, f"{(n % 1000) / 100 - 5:.2f}" if task.endswith(("esol", "lipo")) else ("Yes" if n % 2 else "No")


def write_copy(root: Path, scale: float) -> int:
    """Write the synthetic copy; returns its number of samples."""
    total = 0
    for t in TASKS:
        (root / "core_tag").mkdir(parents=True, exist_ok=True)
        (root / "core_tag" / f"{t.name}.json").write_text(json.dumps(t.core_tags()))
        (root / "template" / "instruction_tuning").mkdir(parents=True, exist_ok=True)
        (root / "template" / "instruction_tuning" / f"{t.name}.json").write_text(
            json.dumps([{"input": "Question about <INPUT> ?", "output": "The answer is <OUTPUT> ."}]))
        per_line = len(SIDE_EFFECTS) if t.name.endswith("sider") else 1
        start = 0  # ids of each split follow the previous split's: a molecule or reaction is in one split
        for split, column in SPLITS:
            lines = max(1, round(t.paper_counts[column] * scale / per_line))
            raw = root / "raw" / split
            raw.mkdir(parents=True, exist_ok=True)
            with (raw / f"{t.name}.jsonl").open("w") as fh:
                for n in range(start, start + lines):
                    core_in, core_out = record(t.name, n)
                    fh.write(json.dumps({"input": core_in, "output": core_out, "task": t.name, "split": split}) + "\n")
            # Related tasks draw from the same id range per split (FS and RS, the NC tasks, MC and MG), so
            # a reaction or molecule is in one split of all of them.
            start += round(_group_counts(t)[column] * scale) if t.split_group else lines
            sdir = root / "sample" / "instruction_tuning" / split
            sdir.mkdir(parents=True, exist_ok=True)
            with (sdir / f"{t.name}.json").open("w") as fh:  # written in pieces: the train lists are large
                fh.write(json.dumps({"task": t.name, "split": split, "template_name": "instruction_tuning"})[:-1])
                fh.write(', "samples": [')
                fh.write(", ".join(json.dumps({"idx": k // per_line, "template_id": 0,
                                               "target": SIDE_EFFECTS[k % per_line] if per_line > 1 else None})
                                   for k in range(lines * per_line)))
                fh.write("]}")
            total += lines * per_line
    return total


def _group_counts(task) -> tuple[int, int, int]:
    """Per split, the largest count among `task`'s split group, so the group's id ranges line up."""
    return tuple(max(c) for c in zip(*(t.paper_counts for t in TASKS if t.split_group == task.split_group)))


WRAPPER = r"""
import json, resource, subprocess, sys, time
try:
    import psutil
except ImportError:
    psutil = None
t0 = time.perf_counter()
proc = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
total = 0  # the sum over the audit and its worker processes, sampled every 0.2 s
while psutil is not None and proc.poll() is None:
    try:
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        total = max(total, sum(p.memory_info().rss for p in tree))
    except psutil.Error:
        pass
    time.sleep(0.2)
out, err = proc.communicate()
print(json.dumps({"rc": proc.returncode, "seconds": time.perf_counter() - t0,
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
                  "peak_total_rss_mib": total / 2**20 if psutil else None,
                  "stdout": out[-3000:], "stderr": err[-3000:]}))
"""


def run_audit(root: Path, out: Path, workers: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, "-m", "llasmol.audit", f"data.path={root}", f"hydra.run.dir={out}", f"workers={workers}"]
    done = subprocess.run([sys.executable, "-c", WRAPPER, *cmd], capture_output=True, text=True, check=True, env=env)
    result = json.loads(done.stdout)
    summary = json.loads((out / "audit.json").read_text())["summary"] if (out / "audit.json").is_file() else None
    return {**result, "summary": summary}


def extrapolate(runs: list[dict], samples: int) -> list[dict]:
    """Per worker count with two or more sizes: least-squares lines of seconds and peak RSS over samples,
    read at `samples` (time grows with the records keyed; memory with the largest file's sorted keys)."""
    fits = []
    for workers in sorted({r["workers"] for r in runs}):
        same = [r for r in runs if r["workers"] == workers]
        if len({r["samples"] for r in same}) < 2 or any(r["scale"] >= 1.0 for r in same):
            continue
        x = [r["samples"] for r in same]
        fit = {"workers": workers, "from_samples": x, "samples": samples}
        for key in ("seconds", "peak_rss_mib", "peak_total_rss_mib"):
            y = [r[key] for r in same]
            if None in y:
                continue
            mx, my = sum(x) / len(x), sum(y) / len(y)
            slope = sum((a - mx) * (b - my) for a, b in zip(x, y)) / sum((a - mx) ** 2 for a in x)
            fit[key] = round(my + slope * (samples - mx), 1)
            fit[f"{key}_per_million"] = round(slope * 1e6, 1)
        fits.append(fit)
    return fits


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scale", type=float, action="append", help="fraction of Table 1's counts (repeatable)")
    parser.add_argument("--workers", type=int, action="append", help="audit workers=… (repeatable; default 1)")
    parser.add_argument("--keep", type=Path, default=None, help="write the copies here and keep them")
    parser.add_argument("--name", default="audit", help="bench/results/<name>.json")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="llasmol-audit-") as tmp:
        base = args.keep or Path(tmp)
        for scale in args.scale or [0.01, 1.0]:
            root = base / f"smolinstruct-x{scale:g}"
            t0 = time.perf_counter()
            samples = write_copy(root, scale)
            size = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
            print(f"scale {scale:g}: wrote {samples:,} samples ({size / 2**20:.0f} MiB) in {time.perf_counter() - t0:.0f} s",
                  flush=True)
            for workers in args.workers or [1]:
                r = run_audit(root, base / f"audit-x{scale:g}-w{workers}", workers)
                total = f", all processes {r['peak_total_rss_mib']:.0f} MiB" if r["peak_total_rss_mib"] else ""
                print(f"scale {scale:g}, workers={workers}: exit {r['rc']}, {r['seconds']:.0f} s, "
                      f"peak RSS {r['peak_rss_mib']:.0f} MiB (largest process){total}", flush=True)
                if r["rc"] != 0:
                    print(r["stdout"], r["stderr"], sep="\n")
                results.append({"scale": scale, "samples": samples, "bytes": size, "workers": workers, "exit": r["rc"],
                                "seconds": round(r["seconds"], 1), "peak_rss_mib": round(r["peak_rss_mib"], 1),
                                "peak_total_rss_mib": r["peak_total_rss_mib"] and round(r["peak_total_rss_mib"], 1),
                                "summary": r["summary"]})
    full = sum(sum(t.paper_counts) for t in TASKS)
    fits = extrapolate(results, full)
    for fit in fits:
        print(f"extrapolated to {full:,} samples, workers={fit['workers']}: {fit.get('seconds')} s, "
              f"peak RSS {fit.get('peak_rss_mib')} MiB (largest process), all processes {fit.get('peak_total_rss_mib')} MiB")
    write_result(args.name, {"runs": results, "extrapolated": fits, "note": "python -m llasmol.audit in a fresh process per run; peak RSS "
                                 "is ru_maxrss of the largest process, total the sampled sum over the audit and its workers"})


if __name__ == "__main__":
    main()
