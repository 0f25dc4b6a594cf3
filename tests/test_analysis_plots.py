"""llasmol.analysis.plots: what each chart shows (sizes, axes, bars, lines, labels, legends) and the
molecule drawings' layout and captions, read off the matplotlib Figure or the drawer's calls.

Expected values are worked out by hand from the docstrings and the conventions the charts follow
(100 dpi PNGs, fractions on 0..1, one bar group per metric, 0.8 of a group's width shared by the variants).
"""

from __future__ import annotations

import math
import struct

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_hex, to_rgba
from matplotlib.container import BarContainer
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties

from llasmol.analysis import plots
from llasmol.analysis.plots import (PNGImage, draw_examples, plot_ablation, plot_failures, plot_topk, plot_trends,
                                    png)
from llasmol.analysis.tables import Table

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def points(size: str) -> float:
    return FontProperties(size=size).get_size_in_points()


def png_size(data: bytes) -> tuple[int, int]:
    """Width and height in pixels, from the PNG's IHDR chunk."""
    assert data.startswith(PNG_MAGIC)
    return struct.unpack(">II", data[16:24])


def texts(fig: Figure) -> list[str]:
    return [t.get_text() for ax in fig.axes for t in ax.texts]


def bar_containers(ax) -> list[BarContainer]:
    return [c for c in ax.containers if isinstance(c, BarContainer)]


# --------------------------------------------------------------------------- PNG bytes and files


def test_a_png_image_shows_inline_reprs_as_one_line_and_saves_into_new_folders(tmp_path):
    image = PNGImage(PNG_MAGIC + b"x" * 3000)  # 3008 bytes: 2 whole kB
    assert image._repr_png_() == bytes(image) and type(image._repr_png_()) is bytes
    assert repr(image) == "<PNG image, 2 kB>"
    target = tmp_path / "new" / "folder" / "a.png"
    assert image.save(target) == target
    assert target.read_bytes() == bytes(image)
    assert image.save(tmp_path / "b.png").read_bytes() == bytes(image)  # into a folder that is there already


def test_charts_are_drawn_by_agg_and_written_as_100_dpi_pngs_into_new_folders(tmp_path):
    curves = {"forward_synthesis": [(1, 0.2), (3, 0.4)]}
    target = tmp_path / "a" / "b" / "topk.png"
    fig = plot_topk(curves, path=target)
    assert isinstance(fig, Figure) and isinstance(fig.canvas, FigureCanvasAgg)
    assert png_size(target.read_bytes()) == (650, 400)  # 6.5 x 4 inches at 100 dpi
    plot_topk(curves, path=tmp_path / "topk.png")  # into a folder that is there already
    assert (tmp_path / "topk.png").read_bytes().startswith(PNG_MAGIC)
    assert png_size(png(fig)) == (650, 400)
    assert png_size(png(fig, dpi=50)) == (325, 200)
    assert isinstance(png(fig), PNGImage)
    # Every chart, drawn or empty, is returned and written where asked.
    for name, chart in {
        "empty_topk": lambda p: plot_topk({}, path=p),
        "failures": lambda p: plot_failures({"fs": {"correct": 1}}, path=p),
        "empty_failures": lambda p: plot_failures({}, path=p),
        "trends": lambda p: plot_trends(Table(["step", "fs/exact_match"], [[1, 0.5]]), path=p),
        "empty_trends": lambda p: plot_trends(Table(["step"], []), path=p),
        "ablation": lambda p: plot_ablation({"fs/exact_match": {"a": 0.5}}, path=p),
        "empty_ablation": lambda p: plot_ablation({}, path=p),
    }.items():
        out = tmp_path / name / "chart.png"
        assert isinstance(chart(out), Figure), name
        assert out.read_bytes().startswith(PNG_MAGIC), name


def test_an_empty_chart_says_why_in_its_middle_on_hidden_axes():
    for fig, why in [(plot_topk({}), "no task reports top-k exact match"),
                     (plot_failures({}), "no predictions"),
                     (plot_trends(Table(["step"], [])), "no validation"),
                     (plot_ablation({}), "no variant has a validation")]:
        assert texts(fig) == [why]
        ax = fig.axes[0]
        text = ax.texts[0]
        assert tuple(text.get_position()) == (0.5, 0.5) and text.get_transform() == ax.transAxes
        assert (text.get_ha(), text.get_va()) == ("center", "center")
        assert len(fig.axes) == 1 and not ax.axison


# --------------------------------------------------------------------------- top-k


def test_the_topk_chart_draws_one_line_per_task_on_a_fraction_axis():
    curves = {"forward_synthesis": [(1, 0.2), (3, 0.4), (5, 0.4)], "retrosynthesis": [(1, 0.1), (10, 0.3)]}
    fig = plot_topk(curves)
    assert tuple(fig.get_size_inches()) == (6.5, 4.0)
    assert fig.get_suptitle() == "Top-k exact match" and fig._suptitle.get_fontsize() == points("medium")
    assert plot_topk(curves, title="run X").get_suptitle() == "run X"
    ax = fig.axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert list(lines) == ["forward_synthesis", "retrosynthesis"]
    assert list(lines["forward_synthesis"].get_xdata()) == [1, 3, 5]
    assert list(lines["forward_synthesis"].get_ydata()) == [0.2, 0.4, 0.4]
    assert list(lines["retrosynthesis"].get_xdata()) == [1, 10]
    assert all(line.get_marker() == "o" for line in lines.values())
    assert list(ax.get_xticks()) == [1, 3, 5, 10]  # every k any task reports, nothing between
    assert ax.get_xlabel() == "k (predictions considered)" and ax.get_ylabel() == "top-k exact match"
    assert ax.get_ylim() == pytest.approx((-0.02, 1.02))
    grid = ax.xaxis.get_gridlines()[0]
    assert grid.get_visible() and grid.get_alpha() == 0.3
    legend = ax.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == ["forward_synthesis", "retrosynthesis"]
    assert legend.get_texts()[0].get_fontsize() == points("small")
    assert tuple(plot_topk({}).get_size_inches()) == (6.5, 4.0) and plot_topk({}).get_suptitle() == "Top-k exact match"


# --------------------------------------------------------------------------- failures


def test_the_failure_chart_stacks_each_tasks_shares_in_category_order():
    # fs: 1 correct, 3 wrong (categories it lacks count 0); s2f: 2 invalid, 2 no answer; none: no samples at all.
    counts = {"fs": {"correct": 1, "wrong": 3}, "s2f": {"correct": 0, "invalid": 2, "no_answer": 2},
              "none": {"correct": 0}}
    fig = plot_failures(counts)
    assert tuple(fig.get_size_inches()) == pytest.approx((8.0, 1.6 + 0.4 * 3))
    assert fig.get_suptitle() == "Top-1 answer outcomes" and fig._suptitle.get_fontsize() == points("medium")
    ax = fig.axes[0]
    bars = {c.get_label(): [(round(p.get_x(), 6), round(p.get_width(), 6)) for p in c] for c in bar_containers(ax)}
    # Categories no task has are left out; each bar starts where the task's previous one ended.
    assert bars == {"correct": [(0.0, 0.25), (0.0, 0.0), (0.0, 0.0)],
                    "wrong": [(0.25, 0.75), (0.0, 0.0), (0.0, 0.0)],
                    "invalid": [(1.0, 0.0), (0.0, 0.5), (0.0, 0.0)],
                    "no_answer": [(1.0, 0.0), (0.5, 0.5), (0.0, 0.0)]}
    colours = {c.get_label(): to_hex(c.patches[0].get_facecolor()) for c in bar_containers(ax)}
    assert colours == {"correct": "#2e7d32", "wrong": "#ef6c00", "invalid": "#c62828", "no_answer": "#9e9e9e"}
    # The first task on top.
    assert [t.get_text() for t in ax.get_yticklabels()] == ["fs", "s2f", "none"] and ax.yaxis_inverted()
    assert ax.get_xlim() == (0.0, 1.0) and ax.get_xlabel() == "share of samples (top-1 answer)"
    legend = fig.legends[0]
    assert [t.get_text() for t in legend.get_texts()] == ["correct", "wrong", "invalid", "no_answer"]
    assert legend._ncols == 6 and legend.get_texts()[0].get_fontsize() == points("small")
    every = plot_failures({"t": {"correct": 1, "wrong": 1, "invalid": 1, "no_answer": 1, "skipped": 1, "scored": 1}})
    colours = {c.get_label(): to_hex(c.patches[0].get_facecolor()) for c in bar_containers(every.axes[0])}
    assert colours["skipped"] == "#5d4037" and colours["scored"] == "#1565c0"
    # Six sixths end a hair short of 1 in floating point: the axis still spans exactly 0..1 (no autoscale margin)
    assert every.axes[0].get_xlim() == (0.0, 1.0)
    empty = plot_failures({}, title="nothing")
    assert tuple(empty.get_size_inches()) == pytest.approx((8.0, 2.0)) and empty.get_suptitle() == "nothing"


# --------------------------------------------------------------------------- trends


def test_the_trends_chart_puts_losses_fractions_and_rmse_on_their_own_panels():
    nan = math.nan
    trends = Table(["epoch", "step", "fs/exact_match", "esol/rmse", "fs/num_no_answer", "bbbp/accuracy", "lipo/rmse"],
                   [[0, 10, 0.1, 2.0, 3.0, None, nan], [1, 20, 0.2, 1.5, 1.0, None, nan]])
    losses = {"train/loss": [(1, 4.0), (2, 3.5)], "val/loss": [(10, 3.6), (20, 3.2)], "other/loss": []}
    fig = plot_trends(trends, losses=losses, title="run Z")
    assert fig.get_suptitle() == "run Z" and fig._suptitle.get_fontsize() == points("medium")
    assert tuple(fig.get_size_inches()) == (4.5 + 3 * 4.5, 4.0)
    assert [ax.get_ylabel() for ax in fig.axes] == ["loss (nats/token)", "value (fraction)", "RMSE (lower is better)"]
    # A count (lower is better, but not an RMSE) stands with the fractions; no epoch, no all-None or all-NaN column.
    labels = [[line.get_label() for line in ax.get_lines()] for ax in fig.axes]
    assert labels == [["train/loss", "val/loss"], ["fs/exact_match", "fs/num_no_answer"], ["esol/rmse"]]
    markers = {line.get_label(): line.get_marker() for ax in fig.axes for line in ax.get_lines()}
    assert markers == {"train/loss": "None", "val/loss": "o", "fs/exact_match": "o", "fs/num_no_answer": "o",
                       "esol/rmse": "o"}
    fraction = fig.axes[1].get_lines()[0]
    assert list(fraction.get_xdata()) == [10, 20] and list(fraction.get_ydata()) == [0.1, 0.2]
    for ax in fig.axes:
        assert ax.get_xlabel() == "step"
        grid = ax.xaxis.get_gridlines()[0]
        assert grid.get_visible() and grid.get_alpha() == 0.3
        assert ax.get_legend().get_texts()[0].get_fontsize() == points("x-small")
        assert [t.get_text() for t in ax.get_legend().get_texts()] == [line.get_label() for line in ax.get_lines()]


def test_the_trends_chart_draws_each_metrics_constant_answer_dashed_in_its_colour_and_its_count():
    """An accuracy that rises to 1.0 where a constant "No" also scores 1.0 reads as no skill: the floor is a dashed
    line of the curve's colour; a latest value on too few samples says so in the legend."""
    from llasmol.metrics.support import Counted

    trends = Table(["step", "clintox/accuracy", "fs/exact_match", "esol/rmse"],
                   [[10, 0.0, 0.0, 2.0], [20, Counted(1.0, "n=4, too few"), 0.25, Counted(1.5, "n=1 of 4, too few")]])
    fig = plot_trends(trends, floors={"clintox/accuracy": 1.0, "esol/rmse": 1.25, "other/accuracy": 0.5})
    fractions, rmse = fig.axes
    curves = {line.get_label(): line for line in fractions.get_lines() if line.get_linestyle() == "-"}
    dashed = [line for line in fractions.get_lines() if line.get_linestyle() == "--"]
    assert list(curves) == ["clintox/accuracy (n=4, too few)", "fs/exact_match"]
    floor, key = dashed  # clintox's floor, and the legend's key for every dashed line
    assert list(floor.get_ydata()) == [1.0, 1.0] and floor.get_color() == curves["clintox/accuracy (n=4, too few)"].get_color()
    assert key.get_label() == "dashed: the best constant answer" and len(key.get_xdata()) == 0
    assert [t.get_text() for t in fractions.get_legend().get_texts()] == [
        "clintox/accuracy (n=4, too few)", "fs/exact_match", "dashed: the best constant answer"]
    (esol_floor,) = [line for line in rmse.get_lines() if line.get_linestyle() == "--" and len(line.get_xdata())]
    assert list(esol_floor.get_ydata()) == [1.25, 1.25]
    assert [t.get_text() for t in rmse.get_legend().get_texts()][0] == "esol/rmse (n=1 of 4, too few)"


def test_the_trends_chart_draws_losses_alone_and_says_no_validation_without_values():
    losses = {"train/loss": [(1, 4.0), (2, 3.5)]}
    alone = plot_trends(Table(["step"], []), losses=losses)  # no validation yet: the loss still moves
    assert texts(alone) == [] and [ax.get_ylabel() for ax in alone.axes] == ["loss (nats/token)"]
    assert [line.get_label() for line in alone.axes[0].get_lines()] == ["train/loss"]
    assert tuple(alone.get_size_inches()) == (9.0, 4.0)
    for trends in (Table(["step", "fs/exact_match"], [[10, None]]),  # validated, but no value
                   Table(["step", "esol/rmse"], [[10, math.nan]]),  # an RMSE with no valid number
                   Table(["fs/exact_match"], [[0.5]])):  # values without steps
        fig = plot_trends(trends)
        assert texts(fig) == ["no validation"], trends
        assert len(fig.axes) == 1 and tuple(fig.get_size_inches()) == (9.0, 4.0)
    assert texts(plot_trends(Table(["step", "fs/exact_match"], [[10, 0.5]]), losses={"val/loss": []})) == []


# --------------------------------------------------------------------------- ablation


ABLATION = {"val/loss": {"a": 3.0, "b": 2.5, "c": 2.0}, "trainable (M)": {"a": 0.1, "b": 0.2, "c": 0.3},
            "minutes": {"a": 1.0, "b": 2.0, "c": 3.0}, "fs/exact_match": {"a": 0.5, "b": None, "c": 0.25},
            "esol/rmse": {"a": 1.5, "b": 1.25, "c": None}}


def test_the_ablation_chart_has_a_panel_per_kind_and_bars_side_by_side():
    fig = plot_ablation(ABLATION, title="sweep")
    assert fig.get_suptitle() == "sweep" and fig._suptitle.get_fontsize() == points("medium")
    assert plot_ablation(ABLATION).get_suptitle() == "LoRA variants"
    assert [ax.get_ylabel() for ax in fig.axes] == [
        "loss, nats/token (lower is better)", "trainable parameters (millions)", "training time (minutes; moves with\nthe machine's other work)",
        "headline metric (fraction)", "RMSE (lower is better)"]
    # Widths 1.5 + 1.5 + 1.5 (one group each) + 3 + 3 (at least 3), and 2 more.
    assert tuple(fig.get_size_inches()) == (12.5, 5.0)
    width = 0.8 / 3
    for ax in fig.axes:
        containers = bar_containers(ax)
        assert [c.get_label() for c in containers] == ["a", "b", "c"]
        # Three variants share 0.8 of the group: centred on -w, 0, +w around the group's tick.
        centres = [p.get_x() + p.get_width() / 2 for c in containers for p in c]
        assert centres == pytest.approx([-width, 0.0, width])
        assert all(p.get_width() == pytest.approx(width) for c in containers for p in c)
        assert list(ax.get_xticks()) == [0]
        (tick,) = ax.get_xticklabels()
        assert (tick.get_rotation(), tick.get_ha(), tick.get_fontsize()) == (35.0, "right", points("small"))
        assert ax.yaxis.label.get_fontsize() == points("small")
        grid = ax.yaxis.get_gridlines()[0]
        assert grid.get_visible() and grid.get_alpha() == 0.3 and not ax.xaxis.get_gridlines()[0].get_visible()
        assert all(c.errorbar is None for c in containers)  # no intervals given, none drawn
        assert [to_hex(c.patches[0].get_facecolor()) for c in containers] == [
            to_hex(to_rgba(f"C{i}")) for i in range(3)]
    heights = [[p.get_height() for c in bar_containers(fig.axes[3]) for p in c]]
    assert heights[0][0] == 0.5 and math.isnan(heights[0][1]) and heights[0][2] == 0.25  # a gap for b
    # Values printed over the loss, parameter, time and RMSE bars (3 decimals, 3 digits, 2 decimals), not over
    # fractions (their axis reads them).
    assert [t.get_text() for t in fig.axes[0].texts] == ["3.000", "2.500", "2.000"]
    assert [t.get_text() for t in fig.axes[1].texts] == ["0.1", "0.2", "0.3"] and len(fig.axes[3].texts) == 0
    assert [t.get_text() for t in fig.axes[2].texts] == ["1.00", "2.00", "3.00"]
    assert [t.get_text() for t in fig.axes[4].texts][:2] == ["1.500", "1.250"]
    legend = fig.legends[0]
    assert [t.get_text() for t in legend.get_texts()] == ["a", "b", "c"]
    assert legend._ncols == 3 and legend.get_texts()[0].get_fontsize() == points("small")


def test_the_ablation_legend_has_at_most_six_columns_and_a_group_per_tick():
    seven = {"fs/exact_match": {f"v{i}": 0.1 * i for i in range(7)}, "rs/exact_match": {"v0": 0.3}}
    fig = plot_ablation(seven)
    assert fig.legends[0]._ncols == 6 and len(fig.legends[0].get_texts()) == 7
    ax = fig.axes[0]
    assert list(ax.get_xticks()) == [0, 1]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["fs/exact_match", "rs/exact_match"]
    first = bar_containers(ax)[0]  # v0: left of each group's centre by 3 of its 7 bar widths
    assert [p.get_x() + p.get_width() / 2 for p in first] == pytest.approx([-3 * 0.8 / 7, 1 - 3 * 0.8 / 7])


def test_the_ablation_chart_is_as_wide_as_its_groups_need_up_to_18_inches():
    five = {f"t{i}/exact_match": {"a": 0.5} for i in range(5)}
    assert tuple(plot_ablation(five).get_size_inches()) == pytest.approx((2.0 + 0.9 * 5, 5.0))
    twenty = {f"t{i}/exact_match": {"a": 0.5} for i in range(20)}
    assert tuple(plot_ablation(twenty).get_size_inches()) == (18.0, 5.0)
    # A variant with no value anywhere: no panel to draw.
    nothing = plot_ablation({"fs/exact_match": {"a": None}})
    assert texts(nothing) == ["no variant has a validation"]


def test_the_ablation_intervals_are_clipped_at_the_value_and_missing_ones_are_flat():
    data = {"fs/exact_match": {"a": 0.5, "b": 0.25}, "rs/exact_match": {"a": 0.4, "b": 0.2},
            "esol/rmse": {"a": 1.0, "b": 2.0}}
    intervals = {"fs/exact_match": {"a": [0.3, 0.6]},  # a's rs value has none: a flat bar
                 "esol/rmse": {"a": [1.2, 1.8], "b": [1.0, 1.5]}}  # off the value: clipped there
    fig = plot_ablation(data, intervals=intervals)
    spans = {}
    for ax in fig.axes:
        for c in bar_containers(ax):
            if c.errorbar is not None:
                bars = c.errorbar.lines[2][0]
                spans[(ax.get_ylabel().split(" (")[0], c.get_label())] = [
                    (round(float(s[0][1]), 3), round(float(s[1][1]), 3)) for s in bars.get_segments()]
                assert bars.get_linewidth() == 0.8 and to_hex(bars.get_color()[0]) == to_hex("0.2")
                assert [cap.get_markersize() for cap in c.errorbar.lines[1]] == [4.0, 4.0]  # capsize 2
    assert spans == {("headline metric", "a"): [(0.3, 0.6), (0.4, 0.4)],
                     ("RMSE", "a"): [(1.0, 1.8)], ("RMSE", "b"): [(1.0, 2.0)]}


# --------------------------------------------------------------------------- molecule drawings


@pytest.fixture
def drawer_calls(monkeypatch) -> dict:
    """What draw_examples asks RDKit's drawer for (the real drawer still draws)."""
    from rdkit.Chem.Draw import rdMolDraw2D

    real, calls = rdMolDraw2D.MolDraw2DCairo, {}

    class Recording:
        def __init__(self, *args):
            calls["size"] = args
            self.drawer = real(*args)
            calls["options"] = self.drawer.drawOptions()

        def drawOptions(self):
            return self.drawer.drawOptions()

        def DrawMolecules(self, mols, legends):
            calls["mols"], calls["legends"] = list(mols), list(legends)
            self.drawer.DrawMolecules(mols, legends=legends)

        def FinishDrawing(self):
            calls["finished"] = True
            self.drawer.FinishDrawing()

        def GetDrawingText(self):
            return self.drawer.GetDrawingText()

    monkeypatch.setattr(rdMolDraw2D, "MolDraw2DCairo", Recording)
    return calls


def test_drawn_examples_pair_gold_and_prediction_with_captions(drawer_calls, tmp_path):
    from rdkit import Chem

    examples = [
        {"index": 3, "category": "wrong", "gold": "CCO", "answer": "CC", "score": 0.25},  # a gold given as text
        {"index": 4, "category": "invalid", "gold": ["not (", "c1ccccc1"], "answer": "C1CC", "score": None},
        {"index": 5, "category": "no_answer", "gold": ["CC(=O)O"], "answer": None, "score": None},
        {"index": 6, "category": "wrong", "gold": ["N"], "answer": "O", "score": None},  # no similarity: none said
        {"index": 7, "category": "wrong", "gold": ["not ("], "answer": "C", "score": 0.5},  # no gold molecule: left out
    ]
    image = draw_examples(examples)
    assert drawer_calls["legends"] == [
        "#3 gold", "predicted (wrong, FTS 0.25)",
        "#4 gold; predicted: invalid 'C1CC'", "",  # RDKit captions no empty panel: said under the gold
        "#5 gold; predicted: no_answer", "",
        "#6 gold", "predicted (wrong)"]
    assert [Chem.MolToSmiles(m) for m in drawer_calls["mols"]] == ["CCO", "CC", "c1ccccc1", "", "CC(=O)O", "", "N", "O"]
    # Two 300-pixel panels a row, a row per example drawn, captions in 14-point type.
    assert drawer_calls["size"] == (600, 1200, 300, 300) and all(type(n) is int for n in drawer_calls["size"])
    assert drawer_calls["options"].legendFontSize == 14 and drawer_calls["finished"]
    assert isinstance(image, PNGImage) and png_size(image) == (600, 1200)
    small = draw_examples(examples[:1], path=tmp_path / "new" / "one.png", panel=100)
    assert drawer_calls["size"] == (200, 100, 100, 100) and png_size(small) == (200, 100)
    assert (tmp_path / "new" / "one.png").read_bytes() == bytes(small)


def test_a_missing_predictions_caption_quotes_at_most_30_characters(drawer_calls):
    fits, cut = "C1" + "C" * 26, "C1" + "C" * 27  # unclosed rings: invalid; quoted, 30 and 31 characters
    draw_examples([{"index": 1, "category": "invalid", "gold": ["C"], "answer": fits},
                   {"index": 2, "category": "invalid", "gold": ["C"], "answer": cut},
                   {"index": 3, "category": "no_answer", "gold": ["C"], "answer": ""}])
    assert drawer_calls["legends"] == [f"#1 gold; predicted: invalid '{fits}'", "",
                                       f"#2 gold; predicted: invalid '{cut[:28]}…", "",
                                       "#3 gold; predicted: no_answer", ""]
    assert plots._clip("x" * 38) == "x" * 38 and plots._clip("x" * 39) == "x" * 37 + "…"
