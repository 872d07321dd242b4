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
from matplotlib.ticker import MaxNLocator

from shared_data.core import config as config_mod
from shared_data.core import config_cli
from shared_data.core.commands import make_parser
from shared_data.core.errors import UserError, run_cli
from shared_data.runtime.records import read_metrics, read_run_info


def latest_records(records: list[dict]) -> list[dict]:
    """The newest record per (label, mode, loader) of an append-only results file, in first-seen order:
    a re-run replaces its earlier measurement instead of hiding behind it."""
    latest = {}
    for r in records:
        latest[(r["label"], r["mode"], r.get("loader"))] = r
    return list(latest.values())


def throughput_plot(records: list[dict], path: Path) -> None:
    """One panel per mode, each on its own linear axis (IO can be a hundred times SYNTHETIC): a bar of
    the median samples/s per run label and loader (SYNTHETIC rows, which use no loader, join their
    label's first loader), a min-max whisker over the timed windows, the value above it."""
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
    fig, axes = plt.subplots(1, len(modes), figsize=(1.5 + 2.6 * len(modes), 4), squeeze=False)
    for ax, mode in zip(axes[0], modes):
        rows = [(i, r) for i, label in enumerate(labels) for r in records if r["label"] == label and r["mode"] == mode]
        for i, r in rows:
            v = r["samples_per_sec"]
            lo, hi = r.get("samples_per_sec_min", v), r.get("samples_per_sec_max", v)
            ax.bar(i, v, 0.8, color=f"C{i}", label=labels[i])
            ax.errorbar(i, v, yerr=[[v - lo], [hi - v]], color="k", capsize=3, lw=0.8)
            ax.annotate(f"{v:.0f}", (i, hi), xytext=(0, 4), textcoords="offset points", ha="center", fontsize=7)
        ax.set_xticks([])
        ax.set_title(mode.upper(), fontsize=9)
        ax.set_ylim(0, 1.15 * max((r.get("samples_per_sec_max", r["samples_per_sec"]) for _, r in rows), default=1))
    axes[0, 0].set_ylabel("samples/s (median, min-max over windows)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=f"C{i}") for i in range(len(labels))]
    fig.legend(handles, labels, fontsize=7, loc="lower center", ncol=min(len(labels), 3))
    fig.suptitle(f"throughput ({records[0]['device']}, batch {records[0]['global_batch']})", fontsize=9)
    fig.tight_layout(rect=(0, 0.06 * (1 + (len(labels) - 1) // 3), 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_title(cfg, workdirs: list[Path]) -> str:
    """``loss, config <name>, <devices>, batch <global batch>`` of the runs in ``workdirs`` (their run.json)."""
    devices = []
    for workdir in workdirs:
        invocations = read_run_info(workdir).get("invocations") or [{}]
        v = invocations[-1].get("versions", {})
        if v.get("devices"):
            devices.append(f"{len(v['devices'])} x {v.get('backend', '?')}")
    device = ", ".join(dict.fromkeys(devices)) or "device not recorded"
    return f"loss, config {cfg.name}, {device}, batch {cfg.global_batch_size}"


def loss_curves_plot(runs: dict[str, list[dict]], path: Path, title: str = "") -> None:
    """Train (solid) and validation (dashed) loss per epoch of each run, on whole-epoch ticks; with
    more than one run a lower panel shows each run's difference from the first in percent, since
    curves that agree to a fraction of a percent hide each other on the loss axis."""
    several = len(runs) > 1
    fig, axes = plt.subplots(
        2 if several else 1, 1, figsize=(6, 5.6 if several else 3.8), sharex=True, squeeze=False,
        gridspec_kw={"height_ratios": [2, 1]} if several else None,
    )  # fmt: skip
    ax = axes[0, 0]
    first = next(iter(runs.values()))
    for j, (name, hist) in enumerate(runs.items()):
        epochs = [h["epoch"] for h in hist]
        # the first run wide and pale underneath, so a run on top of it leaves it visible
        style = (
            dict(color=f"C{j}", ms=4, lw=4.5, alpha=0.4, zorder=1) if j == 0 else dict(color=f"C{j}", ms=3, zorder=2)
        )
        ax.plot(epochs, [h["train_loss"] for h in hist], "-o", label=f"{name} train", **style)
        ax.plot(epochs, [h["val_loss"] for h in hist], "--s", mfc="none", label=f"{name} val", **style)
        if several and j:
            ref = {h["epoch"]: h for h in first}
            for key, style in (("train_loss", "-o"), ("val_loss", "--s")):
                pts = [(h["epoch"], 100 * (h[key] / ref[h["epoch"]][key] - 1)) for h in hist if h["epoch"] in ref]
                axes[1, 0].plot(*zip(*pts), style, color=f"C{j}", ms=4, label=f"{name} {key.split('_')[0]}")
    ax.set_ylabel("L1 loss")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    ax.set_title(title, fontsize=9)
    if several:
        axes[1, 0].axhline(0, color=f"C{0}", lw=0.8)
        axes[1, 0].set_ylabel(f"% vs {next(iter(runs))}")
        axes[1, 0].legend(fontsize=7)
    axes[-1, 0].set_xlabel("epoch")
    axes[-1, 0].xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def validation_report(cfg, weights_path: Path, out: Path, yaml_config: str = str(config_mod.DEFAULT_YAML)) -> dict:
    """The JAX prediction of ``cfg``'s whole validation volume with ``weights_path``
    (``out/prediction_<config>.h5``) validated against its truth (:mod:`shared_data.inference.validate`:
    ``out/validation_<config>.json`` and ``.png``); returns the metrics."""
    from shared_data.inference import validate

    from jax_impl import predict as jax_predict

    truth, pred = cfg.data_file("val"), out / f"prediction_{cfg.name}.h5"
    argv = ["--yaml_config", yaml_config, "--config", cfg.name, "--weights", str(weights_path)]
    jax_predict.main([*argv, "--input", str(truth), "--out", str(pred)])
    return validate.validate_files(pred, truth, out, stem=f"validation_{cfg.name}")


def stale_weights_note(weights_path: Path, workdir: Path) -> str | None:
    """A warning when ``weights_path`` is older than the last epoch that the run in ``workdir`` recorded
    (the run continued after the weights were written), else None."""
    hist = read_metrics(workdir)
    metrics = workdir / "metrics.jsonl"
    if not hist or metrics.stat().st_mtime <= weights_path.stat().st_mtime + 1:
        return None
    return (
        f"warning: {weights_path} is older than epoch {hist[-1]['epoch']} of the run in {workdir}: the figure "
        "validates an earlier model (the trainer with --resume --save_weights rewrites it)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    p = make_parser("dlas_compare.plots", __doc__.split("\n\n")[0])
    p.add_argument("--yaml_config", default=str(config_mod.DEFAULT_YAML), help="YAML file of named configs")
    p.add_argument("--config", default="cpu_default", help=config_cli.config_help())
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
    p.add_argument("--title", help="title of the loss plot (default: config, devices from the runs' run.json, batch)")
    args = p.parse_args(argv)
    cfg = config_mod.load_config(args.config, args.yaml_config)
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
        throughput_plot(latest_records(records), out / f"throughput_{cfg.name}.png")
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
        workdirs = [Path(item.partition("=")[2]).parent for item in args.runs]
    else:
        runs = {fw: read_metrics(root / fw) for fw in ("tf", "jax")}
        workdirs = [root / fw for fw in runs if runs[fw]]
    runs = {k: v for k, v in runs.items() if v}
    if runs:
        loss_curves_plot(runs, out / f"loss_{cfg.name}.png", args.title or run_title(cfg, workdirs))
        print(f"wrote {out / f'loss_{cfg.name}.png'}")
    if not weights_path.is_file():
        print(
            f"no validation figure: {weights_path} not found (the trainers write it with --save_weights "
            f"{weights_path}; --weights W.npz takes any other)"
        )
        return 0
    stale = stale_weights_note(weights_path, weights_path.parent)
    if stale:
        print(stale)
    print(f"validating {weights_path} on {cfg.data_file('val')}")
    summary = validation_report(cfg, weights_path, out, args.yaml_config)
    print(f"wrote {out / f'validation_{cfg.name}.png'} (mean L1 {summary['l1_mean']['model']:.4f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
