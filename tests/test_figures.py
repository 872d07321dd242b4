"""The figures read without squinting, checked through matplotlib's objects: linear throughput axes
with min-max whiskers and the newest records, a titled loss plot on whole epochs where agreeing curves
stay visible, a validation figure with a log P-ratio axis and a panel around 1 (P ratio, r(k), the +-2% band)
whose lines carry the spectra, gaps for empty PDF bins, no machine path
in its title and tick labels that do not overlap, a ladder whose labels clear its whiskers and whose
legend stays plain beside a cross-hatched (unreliable) bar."""

from __future__ import annotations

import itertools
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.container import ErrorbarContainer

from dlas_compare import ladder_figure, ladder_rungs, plots
from shared_data.core import config as config_mod
from shared_data.inference import validate


@pytest.fixture
def figures(monkeypatch):
    """The figures the code under test closes, kept open for inspection."""
    kept = []
    monkeypatch.setattr(plt, "close", lambda fig=None: kept.append(fig))
    yield kept
    monkeypatch.undo()
    for fig in kept:
        plt.close(fig)


def record(label, mode, value, lo, hi, loader="lowmem"):
    return dict(
        label=label,
        mode=mode,
        loader=loader,
        samples_per_sec=value,
        samples_per_sec_min=lo,
        samples_per_sec_max=hi,
        device="1 x NVIDIA H200",
        global_batch=64,
    )


def overlap(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def test_throughput_linear_axes_whiskers_and_newest_records(tmp_path, figures):
    records = [
        record("jax", "full", 3000.0, 2900.0, 3100.0),  # an older run of the same label: replaced
        record("torch", "full", 1928.9, 1900.0, 1950.0),
        record("jax", "full", 3723.3, 3700.0, 3750.0),
        record("jax", "io", 54857.9, 50000.0, 56000.0),
    ]
    plots.throughput_plot(plots.latest_records(records), tmp_path / "t.png")
    (fig,) = figures
    io, full = fig.axes
    assert [ax.get_title() for ax in (io, full)] == ["IO", "FULL"]
    assert io.get_yscale() == full.get_yscale() == "linear"
    heights = sorted(p.get_height() for p in full.patches)
    assert heights == [1928.9, 3723.3]  # the newest jax record, on a linear axis the ratio is what it looks
    assert any(isinstance(c, ErrorbarContainer) for c in full.containers)
    assert full.get_ylim()[1] > 3750.0
    assert "NVIDIA H200" in fig._suptitle.get_text() and "batch 64" in fig._suptitle.get_text()
    assert (tmp_path / "t.png").stat().st_size > 0


def test_loss_plot_title_whole_epochs_and_a_difference_panel(tmp_path, figures):
    bf16 = [{"epoch": e, "train_loss": 0.1 / e, "val_loss": 0.08 / e} for e in range(1, 6)]
    fp32 = [{"epoch": e, "train_loss": 0.1 / e * 1.0007, "val_loss": 0.08 / e * 0.9986} for e in range(1, 6)]
    cfg = config_mod.load_config("short_opt")
    plots.loss_curves_plot({"bf16": bf16, "fp32": fp32}, tmp_path / "l.png", plots.run_title(cfg, []))
    (fig,) = figures
    loss, diff = fig.axes
    assert loss.get_title() == "loss, config short_opt, device not recorded, batch 64"
    assert loss.get_yscale() == "log" and diff.get_yscale() == "linear"
    fig.canvas.draw()
    ticks = [t for t in diff.get_xticks() if 1 <= t <= 5]
    assert ticks and all(float(t).is_integer() for t in ticks)
    assert diff.get_ylabel() == "% vs bf16"
    widths = {line.get_label(): line.get_linewidth() for line in loss.get_lines()}
    assert widths["bf16 train"] > 2 * widths["fp32 train"]  # the first run shows around the one on top
    curves = {line.get_label(): line.get_ydata() for line in diff.get_lines()}
    assert np.allclose(curves["fp32 train"], 0.07) and np.allclose(curves["fp32 val"], -0.14)


def test_loss_title_names_the_device_from_run_json(tmp_path, tiny_cfg):
    run = tmp_path / "jax"
    run.mkdir()
    info = {"invocations": [{"versions": {"devices": ["cpu:0"], "backend": "cpu"}}]}
    (run / "run.json").write_text(json.dumps(info))
    assert plots.run_title(tiny_cfg, [run]) == "loss, config cpu_tiny, 1 x cpu, batch 4"


@pytest.mark.slow
def test_validation_figure_log_ratio_gaps_short_title_no_overlap(tmp_path, figures):
    # the linear (filtered) gas: its baselines' P ratios stay within ~30x, as the axis check below
    # assumes; the nonlinear gas's reach 1e-3 and 200x
    from shared_data.data import generate

    truth = tmp_path / "val_24_filtered.h5"
    generate.main(["--out", str(truth), "--size", "24", "--seed", "2", "--chunk", "16", "--gas", "filtered"])
    validate.validate_files(truth, truth, tmp_path, stem="v")
    (fig,) = figures
    ratio = next(ax for ax in fig.axes if ax.get_ylabel() == "P_pred / P_true (log)")
    # a ratio is a factor: the log axis keeps a model at 0.9 and a baseline at 40 readable together
    assert ratio.get_yscale() == "log" and ratio.get_xscale() == "log"
    ratio.plot([0.1, 1.0], [0.9, 40.0])
    ratio.relim()
    ratio.autoscale_view()
    low, high = ratio.get_ylim()
    assert low < 0.9 and high > 40 and np.log10(high / low) < 3
    for ax in fig.axes:
        if ax.get_ylabel() == "PDF":
            for line in ax.get_lines():
                y = np.asarray(line.get_ydata(), float)
                assert not np.any(y == 1e-6)
                assert np.all(np.isnan(y) | (y > 0))
    l1 = next(ax for ax in fig.axes if ax.get_ylabel() == "L1 (stored units)")
    fig.canvas.draw()
    boxes = [t.get_window_extent() for t in l1.get_xticklabels() if t.get_text()]
    assert len(boxes) == 5 and not any(overlap(a, b) for a, b in itertools.combinations(boxes, 2))
    attrs = {
        "prediction_framework": "jax",
        "prediction_weights": "/home/someone/scratch/runs/cpu_default/jax/weights.npz",
        "prediction_config": "cpu_default",
        "prediction_precision": "float32",
    }
    assert validate.provenance(attrs) == "JAX prediction, .../cpu_default/jax/weights.npz, config cpu_default, float32"
    attrs["prediction_weights"] = "checkpoint /home/someone/runs/cpu_default/jax/checkpoints epoch 3"
    assert validate.provenance(attrs) == (
        "JAX prediction, checkpoint .../cpu_default/jax/checkpoints epoch 3, config cpu_default, float32"
    )
    assert "/home" not in fig._suptitle.get_text()


def test_ladder_labels_clear_the_whiskers(tmp_path, figures):
    summaries = []
    for fw, speeds in (("jax", [100, 180, 700, 800]), ("torch", [90, 200, 650, 820])):
        for i, v in enumerate(speeds, 1):
            summaries.append(
                dict(
                    framework=fw,
                    ladder_step=i,
                    ladder_rung=ladder_rungs.RUNGS[i - 1].name,
                    status="ran",
                    full_samples_per_sec=v,
                    full_samples_per_sec_min=0.9 * v,
                    full_samples_per_sec_max=1.1 * v,
                    speedup_vs_baseline=v / speeds[0],
                    global_batch=64,
                    crop_size=64,
                )
            )
    ladder_figure.write_figure(summaries, tmp_path / "ladder.png", "t")
    (fig,) = figures
    (ax,) = fig.axes
    fig.canvas.draw()
    labels = [t.get_window_extent() for t in ax.texts if t.get_text()[:1].isdigit()]
    whiskers = [
        seg.get_window_extent()
        for c in ax.containers
        if isinstance(c, ErrorbarContainer)
        for seg in [*c.lines[1], *c.lines[2]]
    ]
    assert len(labels) == 8 + 5 and whiskers  # the frameworks' bars and the tutorial's five A100 rungs
    assert not any(overlap(a, b) for a in labels for b in whiskers)
    assert ax.get_yscale() == "linear"


def test_ladder_legend_is_plain_when_a_first_rung_is_unreliable(tmp_path, figures):
    """The unreliable rung's bar is cross-hatched, its framework's legend entry is not (a legend drawn
    from the bars would copy the first bar's hatch and mark the whole framework)."""
    summaries = [
        dict(
            framework=fw,
            ladder_step=1,
            ladder_rung="baseline",
            status="ran",
            full_samples_per_sec=v,
            full_samples_per_sec_min=v,
            full_samples_per_sec_max=v,
            speedup_vs_baseline=1.0,
            verdict="unreliable" if fw == "torch" else "compute-bound",
            global_batch=64,
            crop_size=64,
        )
        for fw, v in (("jax", 159.0), ("torch", 158.5))
    ]
    ladder_figure.write_figure(summaries, tmp_path / "ladder.png", "t")
    (fig,) = figures
    (ax,) = fig.axes
    bars = {c.get_label(): c for c in ax.containers if type(c).__name__ == "BarContainer"}
    assert [p.get_hatch() for p in bars["torch"]] == ["xx"] and [p.get_hatch() for p in bars["jax"]] == [None]
    legend = {t.get_text(): h for t, h in zip(ax.get_legend().get_texts(), ax.get_legend().legend_handles)}
    assert list(legend) == ["jax", "torch", ladder_figure.TUTORIAL_LABEL]
    assert legend["jax"].get_hatch() is None and legend["torch"].get_hatch() is None
    assert legend[ladder_figure.TUTORIAL_LABEL].get_hatch() == "//"


def full_fft_spectra(a: np.ndarray, b: np.ndarray, side: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per bin of width k_f centred on n k_f (n = 1 .. side/2, the validate bins, in units of k_f):
    mean |k| / k_f, P_b / P_a and r = P_ab / sqrt(P_aa P_bb) of the overdensities of ``a`` (truth) and
    ``b``, from full complex FFTs summed over the bins (the normalisations cancel)."""
    fa, fb = (np.fft.fftn(f / f.mean() - 1.0) for f in (a.astype(np.float64), b.astype(np.float64)))
    n = np.fft.fftfreq(side, 1.0 / side)
    kk = np.sqrt(n[:, None, None] ** 2 + n[None, :, None] ** 2 + n[None, None, :] ** 2).ravel()
    shell = np.rint(kk).astype(int)  # |k| / k_f in [m - 1/2, m + 1/2) rounds to m (no mode on an edge)
    shell[kk > side / 2] = -1  # beyond Nyquist
    k, ratio, r = [], [], []
    paa, pbb, pab = np.abs(fa.ravel()) ** 2, np.abs(fb.ravel()) ** 2, (fb * np.conj(fa)).real.ravel()
    for m in range(1, side // 2 + 1):
        sel = shell == m
        k.append(kk[sel].mean())
        ratio.append(pbb[sel].sum() / paa[sel].sum())
        r.append(pab[sel].sum() / np.sqrt(paa[sel].sum() * pbb[sel].sum()))
    return np.array(k), np.array(ratio), np.array(r)


@pytest.mark.slow
def test_validation_figure_near_one_panel_shows_ratio_and_r_with_the_band(data_dir, tmp_path, figures):
    """The linear panel around 1 carries the model's P ratio and r(k) and both baselines' r(k) (the
    dark matter as gas; the non-ML one, the Jeans-filtered dark matter with the mean T-rho relation) of
    gas density and temperature, equal to a full-FFT float64 computation, and the shaded +-2% band."""
    import h5py

    truth = data_dir / "val_24.h5"
    with h5py.File(truth) as f:
        hydro, nbody, attrs = f["Hydro"][...], f["Nbody"][...], dict(f.attrs)
    rng = np.random.default_rng(3)
    pred = hydro.copy()
    pred[:2] += (0.01 * rng.standard_normal(pred[:2].shape)).astype(np.float32)  # noisy density, temperature
    pred_path = tmp_path / "pred.h5"
    with h5py.File(pred_path, "w") as f:
        f["Hydro"] = pred
        for key in ("box_size_mpc_h", "density_scale", "temperature_scale", "igm_T0_K", "velocity_scale_km_s"):
            f.attrs[key] = attrs[key]
    validate.validate_files(pred_path, truth, tmp_path / "v", stem="v")
    (fig,) = figures
    panel = next(ax for ax in fig.axes if ax.get_ylabel() == "P_pred / P_true and r(k), linear")
    assert panel.get_yscale() == "linear" and panel.get_xscale() == "linear"
    lines = {line.get_label(): line for line in panel.get_lines()}
    k_f = 2 * np.pi / attrs["box_size_mpc_h"]
    gamma, s_rho, s_t, t0 = attrs["igm_gamma"], attrs["density_scale"], attrs["temperature_scale"], attrs["igm_T0_K"]
    truth_phys = {"gas_density": np.exp(s_rho * hydro[0].astype(np.float64))}
    truth_phys["gas_temperature"] = t0 * np.exp(s_t * hydro[1].astype(np.float64))
    pred_phys = {"gas_density": np.exp(s_rho * pred[0].astype(np.float64))}
    pred_phys["gas_temperature"] = t0 * np.exp(s_t * pred[1].astype(np.float64))
    rho_dm = np.exp(s_rho * nbody[0].astype(np.float64))
    base_phys = {"gas_density": rho_dm, "gas_temperature": t0 * rho_dm ** (gamma - 1)}
    n = 2 * np.pi * np.fft.fftfreq(24, attrs["box_size_mpc_h"] / 24)
    k2 = n[:, None, None] ** 2 + n[None, :, None] ** 2 + n[None, None, :] ** 2
    rho_f = np.maximum(np.fft.ifftn(np.fft.fftn(rho_dm) / (1 + k2 / attrs["k_jeans_h_mpc"] ** 2)).real, 0.0)
    non_ml_phys = {"gas_density": np.maximum(rho_f, 1e-3), "gas_temperature": t0 * rho_f ** (gamma - 1)}
    for name in ("gas_density", "gas_temperature"):
        k, ratio, r = full_fft_spectra(truth_phys[name], pred_phys[name], 24)
        _, _, r_base = full_fft_spectra(truth_phys[name], base_phys[name], 24)
        _, _, r_non_ml = full_fft_spectra(truth_phys[name], non_ml_phys[name], 24)
        for label, want in (("P ratio model", ratio), ("r model", r), ("r baseline", r_base), ("r non-ML", r_non_ml)):
            line = lines[f"{name} {label}"]
            tol = 1e-5 if label.startswith("r ") and label != "r model" else 1e-9  # baselines: from float32 values
            np.testing.assert_allclose(line.get_xdata(), k * k_f, rtol=1e-9)
            np.testing.assert_allclose(line.get_ydata(), want, rtol=tol)
        assert np.nanmin(ratio) != pytest.approx(1, abs=1e-3)  # the noise shows: not a trivial comparison
    (band,) = [p for p in panel.patches if p.get_label() == "1 ± 2%"]
    y0, y1 = band.get_bbox().y0, band.get_bbox().y1
    assert (y0, y1) == pytest.approx((0.98, 1.02))
    lo, hi = panel.get_ylim()
    assert 0.8 <= lo <= 0.96 and hi >= 1.04
    assert panel.get_xlim()[1] == pytest.approx(np.pi / (attrs["box_size_mpc_h"] / 24) * 1.02)
