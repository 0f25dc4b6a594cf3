"""Analysis of training runs: tables, charts and the paper's numbers (see `llasmol.report`).

    from llasmol import analysis
    run = analysis.load_run("outputs/train/<date>_<time>")
    analysis.headline_table(run)                    # each task's headline metric at the latest validation
    analysis.metric_table(run)                      # every metric of every task
    analysis.plot_topk(analysis.topk_curves(run))   # top-k exact match curves
    analysis.compare_table("outputs/train/multirun/<date>_<time>")   # variants beside the paper
    analysis.paper_table()                          # every system the paper reports, with its source
"""

from llasmol.analysis.compare import (
    COMPARE_PAPER_MODELS,
    ablation_data,
    compare_table,
    paper_table,
    variant_label,
    variant_labels,
)
from llasmol.analysis.paper import (
    PAPER_LLASMOL_MODELS,
    PAPER_MODEL_OF_BASE,
    PAPER_MODELS,
    PAPER_RESULTS,
    PAPER_SOURCES,
    PAPER_TRAINABLE,
    PaperSource,
    paper_metric,
)
from llasmol.analysis.plots import (
    PNGImage,
    draw_examples,
    plot_ablation,
    plot_failures,
    plot_grpo_stage,
    plot_topk,
    plot_trends,
    png,
)
from llasmol.analysis.runs import (
    Run,
    Validation,
    is_multirun_dir,
    is_run_dir,
    load_run,
    load_sweep,
    newest,
    read_csv_log,
    read_predictions,
    variant_dirs,
)
from llasmol.analysis.tables import (
    FAILURE_CATEGORIES,
    headline,
    Table,
    evaluation_note,
    evaluation_table,
    failure_counts,
    failure_table,
    headline_table,
    judge_sample,
    judged_samples,
    metric_table,
    metric_trends,
    topk_curves,
    topk_table,
    worst_examples,
    worst_table,
)

__all__ = [name for name in dir() if not name.startswith("_")]
