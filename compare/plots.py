"""Figures (PNG, matplotlib): throughput per mode and framework, TF vs JAX loss curves, and the
validation report (predicted vs true slices per channel, and the predicted / true power spectrum of
gas density and temperature, how cosmologists judge an emulator).

    python -m compare.plots --config cpu_default --results results/cpu/suite.jsonl   # -> runs/cpu_default/figures
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from shared_data import config as config_mod
from shared_data import cosmology, readers, unet_spec
from shared_data.errors import UserError, run_cli
from shared_data.run import read_metrics

HYDRO_NAMES = ("gas density", "gas temperature", "gas vx", "gas vy", "gas vz")


def throughput_plot(records: list[dict], path: Path) -> None:
    """Grouped bars: samples/s per mode, one bar per run label and loader (SYNTHETIC rows, which use
    no loader, join their label's first loader); the value is printed on each bar."""
    modes = [m for m in ("io", "synthetic", "full") if any(r["mode"] == m for r in records)]
    first_loader = {}
    for r in records:
        if r["mode"] != "synthetic":
            first_loader.setdefault(r["label"], r["loader"])
    records = [
        {
            **r,
            "label": f"{r['label']} ({first_loader.get(r['label'], '-') if r['mode'] == 'synthetic' else r['loader']})",
        }
        for r in records
    ]
    labels = list(dict.fromkeys(r["label"] for r in records))
    fig, ax = plt.subplots(figsize=(1.8 + 2.2 * len(modes), 4))
    width = 0.8 / max(len(labels), 1)
    for i, label in enumerate(labels):
        vals = [
            next((r["samples_per_sec"] for r in records if r["label"] == label and r["mode"] == m), 0) for m in modes
        ]
        bars = ax.bar(np.arange(len(modes)) + i * width, vals, width, label=label)
        ax.bar_label(bars, [f"{v:.0f}" if v else "" for v in vals], fontsize=6)
    ax.set_xticks(np.arange(len(modes)) + width * (len(labels) - 1) / 2, [m.upper() for m in modes])
    ax.set_ylabel("samples/s")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    ax.set_title(f"throughput ({records[0]['device']}, batch {records[0]['global_batch']})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def loss_curves_plot(runs: dict[str, list[dict]], path: Path) -> None:
    """Train and validation loss per epoch for each framework's run."""
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for name, hist in runs.items():
        epochs = [h["epoch"] for h in hist]
        ax.plot(epochs, [h["train_loss"] for h in hist], "-o", label=f"{name} train")
        ax.plot(epochs, [h["val_loss"] for h in hist], "--s", label=f"{name} val")
    ax.set_xlabel("epoch")
    ax.set_ylabel("L1 loss")
    ax.set_yscale("log")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def predict(cfg, weights: dict, inputs: np.ndarray) -> np.ndarray:
    """The JAX model's prediction (float32 NDHWC) for ``inputs`` with canonical ``weights``."""
    import jax.numpy as jnp

    from jax_impl import model as M

    return np.asarray(M.build_model(cfg).apply({"params": M.params_from_canonical(weights)}, jnp.asarray(inputs)))


def validation_crops(cfg) -> tuple[np.ndarray, np.ndarray]:
    """Non-overlapping crops tiling the validation volume, no symmetry: (n, s, s, s, C) inputs, targets."""
    reader = readers.InMemReader(cfg.data_file("val"), cfg.N_in_channels, cfg.N_out_channels, cfg.crop_size)
    nbody, hydro = reader.volumes()
    s, k = cfg.crop_size, reader.size // cfg.crop_size
    xs, ys = [], []
    for i, j, l in np.ndindex(k, k, k):
        sl = np.s_[:, i * s : (i + 1) * s, j * s : (j + 1) * s, l * s : (l + 1) * s]
        xs.append(np.moveaxis(nbody[sl], 0, -1))
        ys.append(np.moveaxis(hydro[sl], 0, -1))
    return np.stack(xs), np.stack(ys)


def power_ratio(pred: np.ndarray, true: np.ndarray, box: float) -> tuple[np.ndarray, np.ndarray]:
    """Mean over crops of P_pred(k) / P_true(k) for fields (n, s, s, s) in a periodic box of ``box``."""
    s = pred.shape[1]
    edges = np.arange(1, s // 2 + 1) * 2 * np.pi / box
    ratios = []
    for p, t in zip(pred, true):
        k, pp, _ = cosmology.measure_power(p - p.mean(), box, edges)
        _, pt, _ = cosmology.measure_power(t - t.mean(), box, edges)
        ratios.append(pp / pt)
    return k, np.nanmean(np.array(ratios), axis=0)


def validation_report(cfg, weights: dict, path: Path) -> dict:
    """Slices of every target channel (true, predicted) and the P(k) ratios; returns summary numbers."""
    x, y = validation_crops(cfg)
    pred = np.concatenate([predict(cfg, weights, x[i : i + 4]) for i in range(0, len(x), 4)])
    cell = 0.25  # Mpc/h, the generator's default voxel
    box = cfg.crop_size * cell
    rho_t, rho_p = np.exp(cfg.density_scale * y[..., 0]), np.exp(cfg.density_scale * pred[..., 0])
    temp_t, temp_p = np.exp(8 * y[..., 1]), np.exp(8 * pred[..., 1])  # T / T0 (generator transform)
    k, r_rho = power_ratio(rho_p / rho_p.mean() - 1, rho_t / rho_t.mean() - 1, box)
    _, r_temp = power_ratio(temp_p / temp_p.mean() - 1, temp_t / temp_t.mean() - 1, box)
    n = cfg.N_out_channels
    fig, axes = plt.subplots(3, n, figsize=(3 * n, 8.5))
    mid = cfg.crop_size // 2
    for c in range(n):
        lo, hi = np.percentile(y[0, :, :, mid, c], [1, 99])
        axes[0, c].imshow(y[0, :, :, mid, c], vmin=lo, vmax=hi)
        axes[1, c].imshow(pred[0, :, :, mid, c], vmin=lo, vmax=hi)
        axes[0, c].set_title(f"true {HYDRO_NAMES[c] if c < 5 else c}", fontsize=8)
        axes[1, c].set_title("predicted", fontsize=8)
        for a in axes[:2, c]:
            a.axis("off")
    for c in range(n):
        axes[2, c].axis("off")
    ax = fig.add_subplot(3, 1, 3)
    ax.semilogx(k, r_rho, "-o", label="gas density")
    ax.semilogx(k, r_temp, "-s", label="gas temperature")
    ax.axhline(1, color="k", lw=0.8)
    ax.set_xlabel("k [h/Mpc]")
    ax.set_ylabel("P_pred / P_true")
    ax.legend()
    l1 = float(np.mean(np.abs(pred - y)))
    fig.suptitle(f"validation: {len(x)} crops of {cfg.crop_size}^3, L1 = {l1:.4f}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return {"l1": l1, "k": k.tolist(), "pk_ratio_density": r_rho.tolist(), "pk_ratio_temperature": r_temp.tolist()}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m compare.plots", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="cpu_default")
    p.add_argument("--results", nargs="*", default=[], help="benchmark JSON lines files for the throughput plot")
    p.add_argument("--weights", help="canonical weights for the validation report (default: the config's JAX run)")
    p.add_argument("--out", help="folder for the PNGs (default: <exp_dir>/<config>/figures)")
    p.add_argument(
        "--runs",
        nargs="*",
        default=[],
        metavar="LABEL=METRICS",
        help="loss curves of these runs' metrics.jsonl files instead of the config's TF and JAX runs",
    )
    args = p.parse_args(argv)
    cfg = config_mod.load_config(args.config)
    root = cfg.resolve_path(cfg.exp_dir) / cfg.name
    weights_path = Path(args.weights) if args.weights else root / "jax" / "weights.npz"
    if args.weights and not weights_path.is_file():
        raise UserError(f"weights file {weights_path} not found")
    records = []
    for f in args.results:
        try:
            records += [json.loads(line) for line in Path(f).read_text().splitlines() if line]
        except (OSError, json.JSONDecodeError) as err:
            raise UserError(f"--results {f}: expected a JSON lines file of benchmark records ({err})") from None
    out = Path(args.out) if args.out else root / "figures"
    out.mkdir(parents=True, exist_ok=True)
    if records:
        throughput_plot(records, out / f"throughput_{cfg.name}.png")
        print(f"wrote {out / f'throughput_{cfg.name}.png'}")
    if args.runs:
        runs = {}
        for item in args.runs:
            label, sep, path = item.partition("=")
            if not sep:
                raise UserError(f"--runs {item}: expected LABEL=PATH of a metrics.jsonl file")
            if not Path(path).is_file():
                raise UserError(f"--runs {item}: {path} not found")
            try:
                hist = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
            except (OSError, json.JSONDecodeError) as err:
                raise UserError(f"--runs {item}: expected a metrics.jsonl file of a training run ({err})") from None
            if not hist or not all(isinstance(h, dict) and {"epoch", "train_loss", "val_loss"} <= set(h) for h in hist):
                raise UserError(
                    f"--runs {item}: expected lines with epoch, train_loss and val_loss "
                    f"(a run's metrics.jsonl), got {len(hist)} lines without them"
                )
            runs[label] = hist
    else:
        runs = {fw: read_metrics(root / fw) for fw in ("tf", "jax")}
    runs = {k: v for k, v in runs.items() if v}
    if runs:
        loss_curves_plot(runs, out / f"loss_{cfg.name}.png")
        print(f"wrote {out / f'loss_{cfg.name}.png'}")
    if weights_path.exists():
        summary = validation_report(cfg, unet_spec.load_weights(weights_path, cfg), out / f"validation_{cfg.name}.png")
        (out / f"validation_{cfg.name}.json").write_text(json.dumps(summary, indent=1))
        print(f"wrote {out / f'validation_{cfg.name}.png'} (L1 {summary['l1']:.4f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
