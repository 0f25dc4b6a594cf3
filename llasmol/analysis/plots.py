"""Charts (matplotlib, rendered by Agg without pyplot's global state) and molecule drawings (RDKit).

Every `plot_*` function returns a `matplotlib.figure.Figure` and, given `path`, also writes it as
PNG.  `png(fig)` / the drawing functions return `PNGImage` bytes, which notebooks display inline.
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Optional, Sequence, Union

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from llasmol.analysis.compare import ANSWERED
from llasmol.analysis.tables import FAILURE_CATEGORIES, Table
from llasmol.metrics.families import COUNTS, LOWER_IS_BETTER
from llasmol.metrics.molecules import parse_molecule
from llasmol.metrics.support import shown

PathLike = Union[str, Path]

_CATEGORY_COLOURS = {
    "correct": "#2e7d32",
    "wrong": "#ef6c00",
    "invalid": "#c62828",
    "no_answer": "#9e9e9e",
    "skipped": "#5d4037",
    "scored": "#1565c0",
}


class PNGImage(bytes):
    """PNG bytes that Jupyter shows as an image."""

    def _repr_png_(self) -> bytes:
        return bytes(self)

    def __repr__(self) -> str:
        # Jupyter stores a text/plain form beside every image: a line, not a copy of the bytes.
        return f"<PNG image, {len(self) // 1024} kB>"

    def save(self, path: PathLike) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self)
        return path


def _figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _finish(fig: Figure, path: Optional[PathLike]) -> Figure:
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, format="png", dpi=100)
    return fig


def png(fig: Figure, dpi: int = 100) -> PNGImage:
    """A figure as PNG bytes (displayable in a notebook)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return PNGImage(buf.getvalue())


def _empty(ax, message: str) -> None:
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes)
    ax.set_axis_off()


def plot_topk(curves: dict[str, list[tuple[int, float]]], path: Optional[PathLike] = None,
              title: str = "Top-k exact match") -> Figure:
    """Top-k exact match against k, one line per task (input: `tables.topk_curves`)."""
    fig = _figure(6.5, 4)
    fig.suptitle(title, fontsize="medium")
    ax = fig.add_subplot()
    if not curves:
        _empty(ax, "no task reports top-k exact match")
        return _finish(fig, path)
    for task, points in curves.items():
        ks, values = zip(*points)
        ax.plot(ks, values, marker="o", label=task)
    ks = sorted({k for points in curves.values() for k, _ in points})
    ax.set_xticks(ks)
    ax.set_xlabel("k (predictions considered)")
    ax.set_ylabel("top-k exact match")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return _finish(fig, path)


def plot_failures(counts: dict[str, dict[str, int]], path: Optional[PathLike] = None,
                  title: str = "Top-1 answer outcomes") -> Figure:
    """Stacked horizontal bars: each task's samples split by top-1 outcome, as shares of the task
    (input: `tables.failure_counts`)."""
    tasks = list(counts)
    fig = _figure(8, 1.6 + 0.4 * max(len(tasks), 1))
    fig.suptitle(title, fontsize="medium")
    ax = fig.add_subplot()
    if not tasks:
        _empty(ax, "no predictions")
        return _finish(fig, path)
    left = [0.0] * len(tasks)
    for category in FAILURE_CATEGORIES:
        shares = []
        for task in tasks:
            total = sum(counts[task].values())
            shares.append(counts[task].get(category, 0) / total if total else 0.0)
        if any(shares):
            ax.barh(tasks, shares, left=left, color=_CATEGORY_COLOURS[category], label=category)
            left = [a + b for a, b in zip(left, shares)]
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("share of samples (top-1 answer)")
    fig.legend(fontsize="small", ncols=len(FAILURE_CATEGORIES), loc="outside lower center")
    return _finish(fig, path)


def _has_values(table: Table, column: str) -> bool:
    return any(v is not None and not (isinstance(v, float) and math.isnan(v)) for v in table.column(column))


def plot_trends(trends: Table, path: Optional[PathLike] = None, title: str = "Metric trends",
                losses: Optional[dict[str, list[tuple[int, float]]]] = None,
                floors: Optional[dict[str, float]] = None,
                rewards: Optional[dict[str, list[tuple[int, float]]]] = None) -> Figure:
    """Each ``<task>/<metric>`` column of `tables.metric_trends` against the step; RMSE (not a
    fraction) on its own axis; a panel with no value at all is left out. `losses` (`Run.loss_curves`:
    ``train/loss`` and ``val/loss`` by step) come first: in a short run of a model that starts from random
    weights they move long before any metric leaves zero. `floors` (``{<task>/<metric>: value}``, the best
    constant answer on the same samples: `trivial.constant_answer_table`) are drawn dashed in their series'
    colour, so an accuracy of 1.0 that a constant "No" also scores reads as what it is; each series' legend
    says how many samples its latest value stands on when that is not all or too few. `rewards` (`Run.reward_curves`:
    a GRPO run's mean reward, overall and per task, by step) get a panel of their own beside the losses."""
    steps = trends.column("step") if "step" in trends.columns else []
    series = [c for c in trends.columns if c not in ("epoch", "step") and _has_values(trends, c)]
    lower = [c for c in series if c.rsplit("/", 1)[-1] in LOWER_IS_BETTER and c.rsplit("/", 1)[-1] not in COUNTS]
    fractions = [c for c in series if c not in lower]
    curves = {name: points for name, points in (losses or {}).items() if points}
    rewarded = {name: points for name, points in (rewards or {}).items() if points}
    curves.update(rewarded)
    panels = [(names, label) for names, label in (([c for c in curves if c not in rewarded], "loss (nats/token)"),
                                                  (list(rewarded), "mean reward (GRPO)"), (fractions, "value (fraction)"),
                                                  (lower, "RMSE (lower is better)")) if names] or [([], "")]
    fig = _figure(4.5 + 4.5 * len(panels), 4)
    fig.suptitle(title, fontsize="medium")
    axes = fig.subplots(1, len(panels)) if len(panels) > 1 else [fig.add_subplot()]
    if not curves and (not series or not steps):
        _empty(axes[0], "no validation")
        return _finish(fig, path)
    for ax, (names, ylabel) in zip(axes, panels):
        for name in names:
            if name in curves:  # the training loss is logged every few steps: a line, no markers
                xs, ys = zip(*curves[name])
                ax.plot(xs, ys, marker="o" if name == "val/loss" else None, label=name)
                continue
            column = trends.column(name)
            values = [math.nan if v is None else v for v in column]
            latest = next((v for v in reversed(column) if v is not None), None)
            (line,) = ax.plot(steps, values, marker="o", label=shown(name, latest))
            if (floors or {}).get(name) is not None:
                ax.axhline(floors[name], color=line.get_color(), linestyle="--", linewidth=0.9)
        if any((floors or {}).get(name) is not None for name in names):
            ax.plot([], [], color="0.4", linestyle="--", label="dashed: the best constant answer")
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="x-small")
    return _finish(fig, path)


def plot_ablation(data: dict[str, dict[str, Optional[float]]], path: Optional[PathLike] = None,
                  title: str = "LoRA variants", intervals: Optional[dict[str, dict[str, Sequence[float]]]] = None
                  ) -> Figure:
    """The variants side by side (input: `compare.ablation_data`): a panel for ``val/loss`` and
    ``train/loss`` (what separates variants of a short run), one for trainable parameters, one for training
    time, one bar group per task for the
    headline fractions, and one for RMSE; panels with no value are left out, a missing value leaves a gap; a
    score that is 0 for every variant is left out and named above the panels (a short demo's exact matches),
    and the share of samples answered between the tags (`compare.ANSWERED`) has a panel of its own.
    `intervals` (``{group: {variant: [lo, hi]}}``, `pairs.ablation_intervals`) draws each bar's interval."""
    variants = list(dict.fromkeys(v for values in data.values() for v in values))
    present = {g: vals for g, vals in data.items() if any(v is not None for v in vals.values())}

    single = ("trainable (M)", "minutes", ANSWERED)  # a group that is a panel of its own
    narrow = ("loss", *single)  # panels of a few groups: 1.5 inches a group

    def kind(group: str) -> str:
        if group in ("val/loss", "train/loss"):
            return "loss"
        if group in single:
            return group
        return "lower" if group.rsplit("/", 1)[-1] in LOWER_IS_BETTER else "fraction"

    # A score that is 0 for every variant draws no bar and tells them apart on nothing: left out, and named.
    zeros = [g for g, vals in present.items() if kind(g) in ("fraction", ANSWERED)
             and all(v == 0 for v in vals.values() if v is not None)]
    present = {g: vals for g, vals in present.items() if g not in zeros}
    panels = [(k, [g for g in present if kind(g) == k], label) for k, label in (
        ("loss", "loss, nats/token (lower is better)"), ("trainable (M)", "trainable parameters (millions)"),
        ("minutes", "training time (minutes; moves with\nthe machine's other work)"), (ANSWERED, "answered (share of samples)"),
        ("fraction", "headline metric (fraction)"), ("lower", "RMSE (lower is better)"))]
    panels = [p for p in panels if p[1]]
    widths = [1.5 * len(groups) if k in narrow else max(3.0, 0.9 * len(groups)) for k, groups, _ in panels]
    fig = _figure(min(18.0, 2.0 + sum(widths)), 5)
    if zeros:  # said under the title, where the layout keeps room for it
        tasks = [g for g in zeros if g != ANSWERED]
        what = (["the answered share"] if ANSWERED in zeros else []) + (
            [f"the headline metric of {len(tasks)} task{'s' * (len(tasks) > 1)} (comparison.md has them)"] if tasks else [])
        title = f"{title}\n0 for every variant, left out: {' and '.join(what)}"
    fig.suptitle(title, fontsize="medium")
    if not panels or not variants:
        _empty(fig.add_subplot(), "no variant has a validation")
        return _finish(fig, path)
    axes = fig.subplots(1, len(panels), width_ratios=widths) if len(panels) > 1 else [fig.add_subplot()]
    width = 0.8 / len(variants)
    for ax, (kind_, groups, label) in zip(axes, panels):
        for i, variant in enumerate(variants):
            xs = [g + (i - (len(variants) - 1) / 2) * width for g in range(len(groups))]
            values = [present[group].get(variant) for group in groups]
            heights = [math.nan if v is None else v for v in values]
            bounds = [(intervals or {}).get(group, {}).get(variant) for group in groups]
            errors = None
            if any(b is not None for b in bounds):  # asymmetric bars: value - lo below, hi - value above
                # A percentile interval of a non-linear metric (RMSE, MCC) may sit off its value: clip at 0.
                errors = [[max(0.0, h - b[0]) if b and h == h else 0.0 for h, b in zip(heights, bounds)],
                          [max(0.0, b[1] - h) if b and h == h else 0.0 for h, b in zip(heights, bounds)]]
            bars = ax.bar(xs, heights, width=width, label=variant, color=f"C{i}", yerr=errors,
                          error_kw={"elinewidth": 0.8, "capsize": 2, "ecolor": "0.2"})
            if kind_ in ("loss", "lower", "minutes", "trainable (M)"):  # close or far apart: print the values
                fmt = {"minutes": "%.2f", "trainable (M)": "%.3g"}.get(kind_, "%.3f")
                ax.bar_label(bars, fmt=fmt, fontsize="x-small")
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels(groups, rotation=35, ha="right", fontsize="small")
        ax.set_ylabel(label, fontsize="small")
        ax.grid(axis="y", alpha=0.3)
    fig.legend(*axes[0].get_legend_handles_labels(), fontsize="small", ncols=min(len(variants), 6),
               loc="outside lower center")
    return _finish(fig, path)


# --------------------------------------------------------------------------- molecule drawings


def _mol(smiles: Optional[str]):
    """An RDKit molecule for drawing (dotted SMILES as one picture), or None when it does not parse."""
    from rdkit import Chem

    if parse_molecule(smiles) is None:
        return None
    return Chem.MolFromSmiles(smiles.replace(";", "."))


def _clip(text: str, n: int = 38) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def draw_examples(examples: Sequence[dict], path: Optional[PathLike] = None, panel: int = 300) -> Optional[PNGImage]:
    """A grid of molecule pairs, one row per example: gold (first gold answer) left, the top-1
    predicted answer right (an empty panel, labelled, when it is missing or invalid).  Examples
    are `tables.worst_examples` entries of SMILES tasks.  None when no example has a gold molecule."""
    from rdkit import Chem
    from rdkit.Chem.Draw import rdMolDraw2D

    mols, legends = [], []
    for ex in examples:
        golds = ex.get("gold") or []
        golds = [golds] if isinstance(golds, str) else list(golds)
        gold = next((m for m in (_mol(g) for g in golds) if m is not None), None)
        if gold is None:
            continue
        predicted = _mol(ex.get("answer"))
        score = ex.get("score")
        similarity = f", FTS {score:.2f}" if isinstance(score, float) and predicted is not None else ""
        mols += [gold, predicted if predicted is not None else Chem.Mol()]
        if predicted is not None:
            legends += [f"#{ex.get('index')} gold", f"predicted ({ex.get('category')}{similarity})"]
        else:  # RDKit draws no legend under an empty panel: say it under the gold one
            answer = f" {_clip(repr(ex['answer']), 30)}" if ex.get("answer") else ""
            legends += [f"#{ex.get('index')} gold; predicted: {ex.get('category')}{answer}", ""]
    if not mols:
        return None
    rows = len(mols) // 2
    drawer = rdMolDraw2D.MolDraw2DCairo(2 * panel, rows * panel, panel, panel)
    drawer.drawOptions().legendFontSize = 14
    drawer.DrawMolecules(mols, legends=legends)
    drawer.FinishDrawing()
    image = PNGImage(drawer.GetDrawingText())
    if path is not None:
        image.save(path)
    return image


def _stage_series(rows: list[dict], name: str) -> list[tuple[int, float]]:
    return [(int(r["step"]), r[name]) for r in rows if r.get(name) is not None and r.get("step") is not None]


def plot_grpo_stage(run, path: Optional[PathLike] = None, title: str = "GRPO") -> Figure:
    """A GRPO run's stage (`grpo_stage`) in four panels by optimizer step, from its CSV log: the rewards (validation
    with its interval), the shares of completions that ended and were cut, collapse (the top answer's share, and
    distinct answers per group on an axis of their own), and token entropy."""
    rows = run.csv_log()
    fig = _figure(12, 7.5)
    axes = fig.subplots(2, 2).ravel()
    ax = axes[0]
    train, val = _stage_series(rows, "train/reward"), _stage_series(rows, "val/reward")
    if train:
        ax.plot(*zip(*train), lw=0.8, alpha=0.6, label="train/reward")
    if val:
        ax.plot(*zip(*val), marker="o", label="val/reward")
        bounds = [(int(r["step"]), r["val/reward_lo"], r["val/reward_hi"]) for r in rows
                  if r.get("val/reward_lo") is not None and r.get("val/reward_hi") is not None]
        if bounds:
            steps, lows, highs = zip(*bounds)
            ax.fill_between(steps, lows, highs, alpha=0.2, label="95% interval")
    _stage_panel(ax, "reward", bool(train or val))
    for ax, names, label in ((axes[1], ("train/completion_ended", "train/completion_clipped", "train/no_signal"),
                              "share of completions / groups"),
                             (axes[2], ("train/collapse/top_answer_share",), "collapse"),
                             (axes[3], ("train/entropy",), "token entropy (nats)")):
        drawn = False
        for name in names:
            points = _stage_series(rows, name)
            if points:
                ax.plot(*zip(*points), lw=0.9, label=name.removeprefix("train/"))
                drawn = True
        _stage_panel(ax, label, drawn)
    distinct = _stage_series(rows, "train/collapse/distinct_answers")
    if distinct:  # a count (at most the group size) beside a share: its own axis
        twin = axes[2].twinx()
        twin.plot(*zip(*distinct), lw=0.9, color="tab:red", label="distinct answers per group")
        twin.set_ylabel("distinct answers per group")
        twin.legend(fontsize=8, loc="lower right")
    if not any(ax.has_data() for ax in axes):
        _empty(axes[0], "no GRPO series in the CSV log")
    fig.suptitle(title)
    return _finish(fig, path)


def _stage_stage_panel(ax, label: str, drawn: bool) -> None:
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(label)
    if drawn:
        ax.legend(fontsize=8)
