"""The validation figure: what ``validate`` draws into ``validation.png``.

A slice of every channel, true / predicted / residual, in physical units with colour bars
(:func:`shared_data.inference.units.physical`); P ratio, r(k), the two PDFs and the per-channel L1;
across the bottom, on one linear axis against k, the model's P ratio and the r(k) of the model and
both baselines with a shaded 1 +- 2% band (:func:`near_one_panel`); the title the caller gives (the
framework, weights and precision of the prediction). The numbers come from
:func:`shared_data.inference.metrics.compute_metrics` in JSON form. matplotlib is imported when a
figure is drawn, not with this module.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from shared_data.core.files import atomic_path
from shared_data.inference.units import DENSITY, TEMPERATURE, Units, physical, unit_label


def figure(path: Path, pred: np.ndarray, truth: np.ndarray, metrics: dict, units: Units, title: str, z: int) -> None:
    """Write the validation figure (PNG, atomically): rows true / predicted / residual of the slice
    ``z`` (third axis) of every channel in physical units with colour bars, then P ratio, r(k),
    the density and temperature PDFs and the per-channel L1, and last, across the figure, a linear
    panel around 1 (:func:`near_one_panel`). ``pred`` and ``truth``: (N_out, L, L, L) stored values;
    ``metrics``: :func:`~shared_data.inference.metrics.compute_metrics`' result in JSON form
    (:func:`~shared_data.inference.metrics.to_json`); ``title``: the figure's suptitle."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = units.hydro_channels
    n = max(len(names), 5)
    fig, axes = plt.subplots(5, n, figsize=(3.4 * n, 15.5), squeeze=False)
    extent = (0, truth.shape[1] * units.voxel_size) * 2
    for c, name in enumerate(names):
        t, p = physical(name, truth[c, :, :, z], units), physical(name, pred[c, :, :, z], units)
        lo, hi = np.percentile(t, [1, 99])
        res = p - t
        lim = float(np.percentile(np.abs(res), 99)) or 1e-12
        for row, (img, kw, label) in enumerate(
            (
                (t, dict(vmin=lo, vmax=hi, cmap="viridis"), f"true {name}"),
                (p, dict(vmin=lo, vmax=hi, cmap="viridis"), "predicted"),
                (res, dict(vmin=-lim, vmax=lim, cmap="RdBu_r"), "predicted - true"),
            )
        ):
            ax = axes[row, c]
            im = ax.imshow(img.T, origin="lower", extent=extent, **kw)
            ax.set_title(label, fontsize=9)
            ax.set_xlabel("x [Mpc/h]", fontsize=7)
            ax.set_ylabel("y [Mpc/h]", fontsize=7)
            ax.tick_params(labelsize=6)
            bar = fig.colorbar(im, ax=ax, fraction=0.046, pad=0.03)
            bar.set_label(("Δ " if row == 2 else "") + unit_label(name), fontsize=7)
            bar.ax.tick_params(labelsize=6)
    for c in range(len(names), n):
        for row in range(3):
            axes[row, c].axis("off")
    styles = {DENSITY: "C0", TEMPERATURE: "C3"}
    ax_ratio, ax_r, ax_pdf_rho, ax_pdf_t, ax_l1 = axes[3, :5]
    for name, s in metrics["power"].items():
        k = np.asarray(s["k"], float)
        ax_ratio.semilogx(k, s["ratio_pred"], "-o", ms=3, color=styles[name], label=f"{name} model")
        ax_r.semilogx(k, s["r_pred"], "-o", ms=3, color=styles[name], label=f"{name} model")
        for tag, label, line in (("baseline", "baseline (DM as gas)", "--"), ("non_ml", "non-ML (filtered DM)", ":")):
            if f"ratio_{tag}" in s:
                ax_ratio.semilogx(k, s[f"ratio_{tag}"], line, color=styles[name], label=f"{name} {label}")
                ax_r.semilogx(k, s[f"r_{tag}"], line, color=styles[name], label=f"{name} {label}")
    ax_ratio.axhline(1, color="k", lw=0.8)
    ax_ratio.set_ylabel("P_pred / P_true (log)")
    # a ratio is read as a factor: on a log axis a model at 0.9 and a baseline at 30 both stay
    # readable (a linear one flattens the model onto zero); the near-1 panel gives the percents
    ax_ratio.set_yscale("log")
    ax_ratio.set_title("power spectrum ratio", fontsize=9)
    ax_r.set_title("cross-correlation", fontsize=9)
    ax_r.axhline(1, color="k", lw=0.8)
    ax_r.set_ylabel("r(k) = P_xy / sqrt(P_xx P_yy)")
    for ax in (ax_ratio, ax_r):
        ax.set_xlabel("k [h/Mpc]")
        ax.axvline(metrics["k_nyquist_h_mpc"], color="gray", lw=0.6, ls=":")
        ax.legend(fontsize=6)
    for ax, name in ((ax_pdf_rho, DENSITY), (ax_pdf_t, TEMPERATURE)):
        d = metrics["pdf"][name]
        centres = 0.5 * (np.asarray(d["edges"][1:]) + np.asarray(d["edges"][:-1]))
        for tag, style in (("true", "k-"), ("pred", "C1-"), ("baseline", "C2--"), ("non_ml", "C4:")):
            if tag in d:
                values = np.asarray(d[tag], float)
                ax.semilogy(centres, np.where(values > 0, values, np.nan), style, label=tag)  # empty bins: gaps
        ax.set_xlabel(d["variable"])
        ax.set_ylabel("PDF")
        ax.set_title(f"{name} one-point PDF", fontsize=9)
        ax.legend(fontsize=6)
    x = np.arange(len(names))
    l1 = metrics["l1"]
    ax_l1.bar(x - 0.27, [l1[m]["model"] for m in names], 0.27, label="model")
    ax_l1.bar(x, [l1[m]["baseline"] or 0.0 for m in names], 0.27, label="DM as gas")
    ax_l1.bar(x + 0.27, [l1[m].get("non_ml") or 0.0 for m in names], 0.27, label="non-ML")
    ax_l1.set_xticks(x, [m.replace("gas_", "") for m in names], fontsize=7, rotation=90)
    ax_l1.set_title("L1 per channel", fontsize=9)
    ax_l1.set_ylabel("L1 (stored units)")
    ax_l1.legend(fontsize=6)
    for ax in axes[3, 5:]:
        ax.axis("off")
    grid = axes[4, 0].get_gridspec()
    for ax in axes[4]:
        ax.remove()
    near_one_panel(fig.add_subplot(grid[4, :]), metrics, styles)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    with atomic_path(path, ".png") as tmp:
        fig.savefig(tmp, dpi=90, format="png")
    plt.close(fig)


#: Half-width of the shaded band around 1 in the linear panel of :func:`near_one_panel`.
BAND = 0.02
#: Lowest value the linear panel shows; lower values leave the axis, and the panel says so.
NEAR_ONE_FLOOR = 0.8


def near_one_panel(ax, metrics: dict, styles: dict[str, str]) -> None:
    """Draw, on one linear axis against linear k (h/Mpc) up to Nyquist, P_pred / P_true and r(k) of
    the model and r(k) of both baselines for gas density and temperature (``metrics["power"]``), with a
    shaded band 1 +- :data:`BAND` and a dotted line at k_Nyquist / 2: a deficit of a few percent at
    small scales is seen at once. The y range spans the lowest plotted value (at least
    :data:`NEAR_ONE_FLOOR`, at most 0.96) to above 1 + BAND; values below it are named in a note.
    Line labels: ``"<name> P ratio model"``, ``"<name> r model"``, ``"<name> r baseline"`` (the dark
    matter as gas), ``"<name> r non-ML"``."""
    ax.axhspan(1 - BAND, 1 + BAND, color="0.85", zorder=0, label=f"1 ± {BAND:.0%}")
    ax.axhline(1, color="k", lw=0.8)
    lowest = []
    for name, s in metrics["power"].items():
        k = np.asarray(s["k"], float)
        series = [("P ratio model", s["ratio_pred"], "-o"), ("r model", s["r_pred"], "-s")]
        if "r_baseline" in s:
            series.append(("r baseline", s["r_baseline"], "--"))
        if "r_non_ml" in s:
            series.append(("r non-ML", s["r_non_ml"], ":"))
        for what, values, style in series:
            y = np.asarray([np.nan if v is None else v for v in values], float)
            ax.plot(
                k,
                y,
                style,
                ms=3,
                lw=1.2,
                color=styles[name],
                label=f"{name} {what}",
                mfc="none" if what.startswith("r ") else styles[name],
            )
            lowest.append((float(np.nanmin(y)) if np.isfinite(y).any() else 1.0, f"{name} {what}"))
    k_nyq = metrics["k_nyquist_h_mpc"]
    ax.axvline(k_nyq / 2, color="gray", lw=0.8, ls=":", label="k_Nyquist / 2")
    low = min((v for v, _ in lowest), default=1.0)
    bottom = min(0.96, max(NEAR_ONE_FLOOR, low - 0.01))
    ax.set_ylim(bottom, 1 + max(2 * BAND, (1 - bottom) / 3))
    ax.set_xlim(0, k_nyq * 1.02)
    off = [what for v, what in lowest if v < bottom]
    if off:
        ax.annotate("below the axis: " + ", ".join(off), (0.01, 0.97), xycoords="axes fraction", va="top", fontsize=7)
    ax.set_xlabel("k [h/Mpc]")
    ax.set_ylabel("P_pred / P_true and r(k), linear")
    ax.set_title(f"near 1: power ratio and cross-correlation, band ± {BAND:.0%}", fontsize=9)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.005, 0.5))  # outside: the data stay clear
