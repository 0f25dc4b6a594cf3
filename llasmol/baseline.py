"""`python -m llasmol.baseline method=<name>`: a non-LLM method answers a split, scored as a model is.

    python -m llasmol.baseline method=rdkit                                  # the bundled sample's test split
    python -m llasmol.baseline method=nearest_neighbor data=smolinstruct data.split=test
    python -m llasmol.baseline --multirun method=rdkit,opsin,fingerprint,nearest_neighbor

Methods (`llasmol.baselines.METHODS`): rdkit, opsin, fingerprint, nearest_neighbor. The folder
(outputs/baseline/<date>_<time>/) holds predictions/<split>.jsonl, metrics/<split>.json and baseline.json;
`python -m llasmol.report <folder>` reads it as a run named baseline:<method>.
"""

from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from llasmol.core.config import CONFIG_DIR
from llasmol.core.errors import report_user_errors
from llasmol.core.quiet import quiet_known_noise


def baseline(cfg: DictConfig) -> dict:
    """Run `cfg.method` on `cfg.data.split`; returns the metrics and where they were written."""
    from llasmol.baselines import get_method
    from llasmol.baselines.runner import run_baseline
    from llasmol.data.source import SMolInstructSource

    quiet_known_noise()
    cls = get_method(cfg.method)
    # The method's own settings, with the Morgan fingerprint shared by the methods that use one.
    blocks = [*cls.shared_settings, cls.name]
    settings = {k: v for b in blocks if b in cfg for k, v in OmegaConf.to_container(cfg[b], resolve=True).items()}
    method = cls(settings, seed=int(cfg.seed), n_jobs=int(cfg.n_jobs))
    data = OmegaConf.to_container(cfg.data, resolve=True)
    source = SMolInstructSource.from_config(data)
    results, out = run_baseline(method, source, cfg.data.split, cfg.generation, Path(cfg.paths.output_dir),
                                Path(cfg.output) if cfg.output else None, named_tasks=data.get("tasks") is not None)
    return {"metrics": results, "output": str(out), "folder": str(cfg.paths.output_dir)}


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="baseline")
@report_user_errors
def main(cfg: DictConfig) -> None:
    from llasmol.evaluate import format_table

    result = baseline(cfg)
    print(format_table(result["metrics"]))
    print(f"metrics written to {result['output']}\n  report: python -m llasmol.report {result['folder']}", flush=True)


if __name__ == "__main__":
    main()
