"""Benchmark 5: start-up of the default training run, and import costs.

- wall time of `python -m llasmol.train logger=csv trainer.max_steps=1 val_every_n_steps=1000`
  (subprocess start to exit, a run of one training step: an upper bound on command -> first step),
  and the time from subprocess start to the first training batch, taken from a timestamp that a
  sitecustomize hook (an extra PYTHONPATH folder) records at Lightning's `on_train_batch_start`;
- `python -X importtime -c "import llasmol"` total, and the cumulative import time of
  `llasmol.train` and `llasmol.evaluate`;
- which heavy modules (rdkit, wandb, bitsandbytes, ...) each entry module pulls in.

No baseline: the figures are reported as they are.

    python bench/startup.py
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, write_result  # noqa: E402

HEAVY = ["rdkit", "wandb", "bitsandbytes", "nltk", "peft", "transformers", "lightning", "torch", "selfies", "matplotlib", "pandas"]

HOOK = r"""
import os, time
def _install():
    import lightning.pytorch.trainer.call as call
    orig = call._call_lightning_module_hook
    def hook(trainer, hook_name, *a, **k):
        path = os.environ.get("LLASMOL_BENCH_FIRST_STEP")
        if hook_name == "on_train_batch_start" and path and not os.path.exists(path):
            import json, sys
            heavy = os.environ.get("LLASMOL_BENCH_HEAVY", "").split(",")
            with open(path, "w") as fh:
                json.dump({"t": time.time(), "loaded": {m: m in sys.modules for m in heavy}}, fh)
        return orig(trainer, hook_name, *a, **k)
    call._call_lightning_module_hook = hook
import builtins, sys
_real_import = builtins.__import__
def _watch(name, *a, **k):
    mod = _real_import(name, *a, **k)
    m = sys.modules.get("lightning.pytorch.trainer.call")
    if m is not None and hasattr(m, "_call_lightning_module_hook") and not getattr(_watch, "done", False):
        _watch.done = True
        builtins.__import__ = _real_import
        _install()
    return mod
builtins.__import__ = _watch
"""


def env() -> dict:
    e = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", WANDB_MODE="offline",
             TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    return e


def first_step(tmp: Path) -> dict:
    hook_dir = tmp / "hook"
    hook_dir.mkdir()
    (hook_dir / "sitecustomize.py").write_text(HOOK)
    stamp = tmp / "first_step"
    e = env()
    e["PYTHONPATH"] = os.pathsep.join([str(hook_dir), e.get("PYTHONPATH", "")])
    e["LLASMOL_BENCH_FIRST_STEP"] = str(stamp)
    e["LLASMOL_BENCH_HEAVY"] = ",".join(HEAVY)
    cmd = [sys.executable, "-m", "llasmol.train", "logger=csv", "trainer.max_steps=1", "val_every_n_steps=1000",
           "trainer.enable_progress_bar=false", f"hydra.run.dir={tmp / 'run'}"]
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, env=e, capture_output=True, text=True)
    total = time.time() - t0
    if proc.returncode:
        print(proc.stderr[-3000:])
        raise SystemExit("the training run failed")
    mark = json.loads(stamp.read_text()) if stamp.exists() else None
    first = mark["t"] - t0 if mark else None
    return {"command": " ".join(["python"] + cmd[1:5]), "wall_s": total, "to_first_step_s": first,
            "loaded_at_first_step": mark["loaded"] if mark else None}


def importtime(stmt: str) -> dict:
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", stmt], cwd=ROOT, env=env(),
                          capture_output=True, text=True, check=True)
    rows = []
    for line in proc.stderr.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|(\s*)(\S+)", line)
        if m:
            rows.append((int(m.group(1)), int(m.group(2)), len(m.group(3)), m.group(4)))
    top = [r for r in rows if r[2] == 1]
    total = sum(r[1] for r in top) / 1e6
    cumulative = {r[3]: r[1] / 1e6 for r in rows}
    biggest = sorted(top, key=lambda r: -r[1])[:8]
    return {"total_s": total, "cumulative_s": cumulative,
            "top_level": [{"module": r[3], "cumulative_s": r[1] / 1e6} for r in biggest]}


def heavy_modules(module: str) -> dict:
    code = f"import {module}, sys, json; print(json.dumps({{m: m in sys.modules for m in {HEAVY!r}}}))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env(), capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    result = {}
    with tempfile.TemporaryDirectory(prefix="llasmol-startup-") as tmp:
        result["train"] = first_step(Path(tmp))
    t = result["train"]
    print(f"python -m llasmol.train (1 step): {t['wall_s']:.1f}s wall; first training batch at {t['to_first_step_s']:.1f}s")
    print("loaded at the first step: " + ", ".join(f"{m}={'yes' if v else 'no'}" for m, v in t["loaded_at_first_step"].items()))
    imports = {}
    for stmt, key in (("import llasmol", "llasmol"), ("import llasmol.train", "llasmol.train"),
                      ("import llasmol.evaluate", "llasmol.evaluate")):
        it = importtime(stmt)
        imports[key] = {"total_s": it["total_s"], "module_cumulative_s": it["cumulative_s"].get(key),
                        "top_level": it["top_level"]}
        print(f"python -X importtime -c '{stmt}': total {it['total_s']:.2f}s, {key} cumulative "
              f"{(it['cumulative_s'].get(key) or 0):.2f}s; biggest: "
              + ", ".join(f"{r['module']} {r['cumulative_s']:.2f}s" for r in it["top_level"][:4]))
    result["imports"] = imports
    loaded = {}
    for module in ("llasmol", "llasmol.data.datamodule", "llasmol.metrics.scoring", "llasmol.train", "llasmol.evaluate",
                   "llasmol.inference.beam_search", "llasmol.report"):
        loaded[module] = heavy_modules(module)
        print(f"import {module}: " + ", ".join(f"{m}={'yes' if v else 'no'}" for m, v in loaded[module].items()))
    result["heavy_modules_loaded"] = loaded
    write_result("startup", {"baseline": None, "ours": t, "ratio": None, "target": None, "met": None, **result})


if __name__ == "__main__":
    main()
