"""The ladder's figure: FULL per rung, one bar per framework.

Grouped bars on a linear axis from zero, one colour per framework (the same colour for a framework in
every figure), whiskers from the slowest to the fastest timed window, the value over each bar,
"skipped" where a rung did not run, a rung whose verdict is ``unreliable`` cross-hatched with a "?"
after its value. A ladder at the tutorial's batch and crop (:data:`TUTORIAL_SIZE`) shows samples/s
beside the tutorial's own ladder on one A100 (grey hatched bars); any other ladder (a CPU's) shows
each framework's FULL relative to its own baseline, and no A100 bars, whose numbers are of another
size.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from dlas_compare.ladder_rungs import RUNGS
from shared_data.core.files import atomic_path

#: the NERSC SC21 tutorial's ladder on one A100-40GB, FULL samples/s at batch 64 (its README), on our
#: rungs: 8 workers for "more workers"; its JIT step, which follows its fused-Adam step (534), for
#: "compilation"; it has no GPU-resident input rung and no one-GPU data-parallel rung
TUTORIAL_A100_SC21 = {"baseline": 86.5, "workers": 274.0, "dali": 395.0, "amp": 513.0, "compile": 542.0}
TUTORIAL_LABEL = "tutorial (SC21, PyTorch), one A100"
#: (global batch, crop size) of the tutorial's A100 ladder
TUTORIAL_SIZE = (64, 64)
COLOURS = {"jax": "C0", "tf": "C1", "torch": "C2"}
REFERENCE_COLOUR = "0.75"


def at_tutorial_size(summaries: list[dict]) -> bool:
    """Whether the ladder ran at the tutorial's global batch and crop (:data:`TUTORIAL_SIZE`); a
    summary without ``crop_size`` (older files) is judged by its batch."""
    batch = next((s["global_batch"] for s in summaries if s.get("global_batch")), None)
    crop = next((s["crop_size"] for s in summaries if s.get("crop_size")), None)
    return batch == TUTORIAL_SIZE[0] and crop in (None, TUTORIAL_SIZE[1])


def ladder_axes(summaries: list[dict], rungs: list[tuple[str, str]], title: str, reference: dict | None = None):
    """The figure of the ladder's ``summaries``: for each of ``rungs`` (name, title) one group of bars,
    one bar per framework in the summaries; at the tutorial's size (:func:`at_tutorial_size`) FULL
    samples/s and one bar for ``reference`` (rung name -> samples/s; default
    :data:`TUTORIAL_A100_SC21`), else FULL over the framework's baseline FULL (its
    ``speedup_vs_baseline``) and no reference; returns the matplotlib Figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.patches import Patch

    absolute = at_tutorial_size(summaries)
    reference = (TUTORIAL_A100_SC21 if reference is None else reference) if absolute else {}
    frameworks = list(dict.fromkeys(s["framework"] for s in summaries))
    colours = {fw: COLOURS.get(fw, f"C{3 + j}") for j, fw in enumerate(frameworks)}
    series = len(frameworks) + (1 if reference else 0)
    width = 0.8 / series
    x = np.arange(len(rungs))
    fig, ax = plt.subplots(figsize=(10, 4.8))
    for j, fw in enumerate(frameworks):
        rows = {s["ladder_rung"]: s for s in summaries if s["framework"] == fw}
        base = rows.get("baseline", {}).get("full_samples_per_sec")
        scale = 1.0 if absolute else (1.0 / base if base else None)
        colour = colours[fw]
        heights, lows, highs, xs, hatches = [], [], [], [], []
        for i, (name, _) in enumerate(rungs):
            xi = x[i] - 0.4 + width * (j + 0.5)
            s = rows.get(name)
            if not s or not s["full_samples_per_sec"] or s["status"] != "ran" or scale is None:
                word = s["status"] if s and (s["status"] != "ran" or scale is not None) else "-"
                word = "no baseline" if s and s["status"] == "ran" and scale is None else word
                ax.text(xi, 0.01, word, rotation=90, ha="center", va="bottom", fontsize=7, color=colour,
                        transform=ax.get_xaxis_transform())  # fmt: skip
                continue
            v = s["full_samples_per_sec"] * scale
            lo = (s["full_samples_per_sec_min"] or s["full_samples_per_sec"]) * scale
            hi = (s["full_samples_per_sec_max"] or s["full_samples_per_sec"]) * scale
            heights.append(v), lows.append(max(v - lo, 0)), highs.append(max(hi - v, 0)), xs.append(xi)
            unreliable = s.get("verdict") == "unreliable"
            hatches.append("xx" if unreliable else None)
            text = f"{v:.0f}" if absolute else f"{v:.2f}x"
            # a few points above the whisker's cap, so no label touches a whisker
            ax.annotate(text + ("?" if unreliable else ""), (xi, hi), xytext=(0, 4), textcoords="offset points",
                        ha="center", va="bottom", fontsize=6.5)  # fmt: skip
        bars = ax.bar(xs, heights, width, color=colour, label=fw)
        for bar, hatch in zip(bars, hatches):
            bar.set_hatch(hatch)
        for xi, v, lo, hi in zip(xs, heights, lows, highs):  # one whisker per bar
            ax.errorbar(xi, v, yerr=[[lo], [hi]], fmt="none", ecolor="k", capsize=2.5, lw=0.8)
    # the legend's patches drawn plain: a bar's own patch would carry its hatch when the first rung is unreliable
    handles = [Patch(facecolor=colours[fw], label=fw) for fw in frameworks]
    if reference:
        ref_x = [x[i] - 0.4 + width * (series - 0.5) for i, (name, _) in enumerate(rungs) if name in reference]
        ref_v = [reference[name] for name, _ in rungs if name in reference]
        ax.bar(ref_x, ref_v, width, color=REFERENCE_COLOUR, hatch="//", edgecolor="0.45", label=TUTORIAL_LABEL)
        handles.append(Patch(facecolor=REFERENCE_COLOUR, hatch="//", edgecolor="0.45", label=TUTORIAL_LABEL))
        for xi, v in zip(ref_x, ref_v):
            ax.annotate(f"{v:.0f}", (xi, v), xytext=(0, 4), textcoords="offset points", ha="center", va="bottom",
                        fontsize=6.5, color="0.35")  # fmt: skip
    else:
        ax.axhline(1.0, color="k", lw=0.6)
    ax.set_xticks(x, [f"{i}. {t}" for i, (_, t) in enumerate(rungs, 1)], fontsize=8)
    ax.set_yscale("linear")
    ax.set_ylim(bottom=0)
    if absolute:
        ax.set_ylabel("FULL samples/s (median window; whiskers: min-max)")
    else:
        ax.set_ylabel("FULL / own baseline's (median; whiskers: min-max)")
        ax.set_ylim(top=ax.get_ylim()[1] * 1.12)  # room for the labels and the legend above the bars
    ax.legend(
        handles=handles,
        fontsize=8,
        loc="upper left" if absolute else "upper right",
        ncol=1 if absolute else len(frameworks),
    )
    ax.set_title(textwrap.fill(title, 110), fontsize=10)  # a long title wraps instead of running off the figure
    fig.tight_layout()
    return fig


def figure_title(summaries: list[dict], config: str) -> str:
    """``The tutorial's ladder on <device>, config <config>, batch <global batch>[, <crop>^3 crops]:
    FULL samples/s per rung`` (or ``FULL per rung relative to each framework's baseline``, the other
    size's figure), then ``; cross-hatched: unreliable`` where a rung's verdict is. The devices of the
    frameworks are named once where they differ only in spelling (``1 x cpu``, ``1 x CPU``), each
    where they differ."""
    devices: dict[str, str] = {}
    for s in summaries:
        if s.get("device"):
            devices.setdefault(s["device"].lower(), s["device"].replace(" cpu", " CPU"))
    batch = next((s["global_batch"] for s in summaries if s.get("global_batch")), None)
    crop = next((s["crop_size"] for s in summaries if s.get("crop_size")), None)
    where = "; ".join(devices.values()) or "no device (nothing ran)"
    size = f"batch {batch}" + (f", {crop}^3 crops" if crop else "")
    relative = "FULL per rung relative to each framework's baseline"
    what = "FULL samples/s per rung" if at_tutorial_size(summaries) else relative
    flagged = "; cross-hatched: unreliable" if any(s.get("verdict") == "unreliable" for s in summaries) else ""
    return f"The tutorial's ladder on {where}, config {config}, {size}: {what}{flagged}"


def save(fig, path: str | Path) -> None:
    """Write ``fig`` atomically to ``path`` (PNG) and close it."""
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path, suffix=path.suffix or ".png") as tmp:
        fig.savefig(tmp, dpi=120)
    plt.close(fig)


def write_figure(summaries: list[dict], path: str | Path, config: str) -> None:
    """The ladder's figure (:func:`dlas_compare.ladder_figure.ladder_axes`: FULL samples/s per rung and
    framework beside the tutorial's A100 ladder), written atomically to ``path`` (PNG)."""
    rungs = [(r.name, r.title) for r in RUNGS]
    fig = ladder_axes(summaries, rungs, figure_title(summaries, config))
    save(fig, path)
