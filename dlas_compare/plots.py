"""Figures (PNG, matplotlib): throughput per mode and framework, TF vs JAX loss curves, and the
validation report of the JAX run's weights on the whole validation volume (:mod:`shared_data.inference.validate`:
slices, residuals, P ratio, r(k), PDFs and L1 against the dark-matter baseline).

    python -m dlas_compare.plots --config cpu_default --results results/cpu/suite.jsonl   # -> runs/cpu_default/figures
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from shared_data.core import config as config_mod
from shared_data.core.commands import make_parser
from shared_data.core.errors import UserError, run_cli
from shared_data.runtime.records import read_metrics


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


def validation_report(cfg, weights_path: Path, out: Path) -> dict:
    """The JAX prediction of ``cfg``'s whole validation volume with ``weights_path``
    (``out/prediction_<config>.h5``) validated against its truth (:mod:`shared_data.inference.validate`:
    ``out/validation_<config>.json`` and ``.png``); returns the metrics."""
    from jax_impl import predict as jax_predict
    from shared_data.inference import validate

    truth, pred = cfg.data_file("val"), out / f"prediction_{cfg.name}.h5"
    jax_predict.main(["--config", cfg.name, "--weights", str(weights_path), "--input", str(truth), "--out", str(pred)])
    return validate.validate_files(pred, truth, out, stem=f"validation_{cfg.name}")


def main(argv: Sequence[str] | None = None) -> int:
    p = make_parser("dlas_compare.plots", __doc__.split("\n\n")[0])
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
        summary = validation_report(cfg, weights_path, out)
        print(f"wrote {out / f'validation_{cfg.name}.png'} (mean L1 {summary['l1_mean']['model']:.4f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
