"""Side-by-side summary of finished TF and JAX runs of one config:
``python -m dlas_compare.summary --config cpu_default`` (reads ``<exp_dir>/<config>/{tf,jax}/metrics.jsonl``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from shared_data.core import config as config_mod
from shared_data.core import config_cli
from shared_data.core.commands import make_parser
from shared_data.core.errors import UserError, run_cli
from shared_data.runtime.records import read_metrics

ROWS = [
    ("epochs", "epoch", "{:d}"),
    ("steps", "step", "{:d}"),
    ("final train loss", "train_loss", "{:.6f}"),
    ("final val loss", "val_loss", "{:.6f}"),
    ("samples/s (last epoch)", "samples_per_sec", "{:.1f}"),
    ("compile s", "compile_sec", "{:.1f}"),
]


def summary_table(runs: dict[str, list[dict]]) -> str:
    """A text table with one column per framework from their metrics histories."""
    names = list(runs)
    width = max(len(r[0]) for r in ROWS) + 2
    lines = [f"{'':<{width}}" + "".join(f"{n:>14}" for n in names)]
    for label, key, fmt in ROWS:
        cells = []
        for n in names:
            last = runs[n][-1] if runs[n] else {}
            cells.append(fmt.format(last[key]) if key in last else "-")
        lines.append(f"{label:<{width}}" + "".join(f"{c:>14}" for c in cells))
    curves = {n: [h["val_loss"] for h in runs[n]] for n in names}
    lines.append("val loss per epoch: " + "; ".join(f"{n}: " + ", ".join(f"{v:.4f}" for v in curves[n]) for n in names))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = make_parser("dlas_compare.summary", __doc__.split("\n")[0])
    p.add_argument("--yaml_config", default=str(config_mod.DEFAULT_YAML), help="YAML file of named configs")
    p.add_argument("--config", default="cpu_default", help=config_cli.config_help())
    p.add_argument("--exp_dir", help="root of runs (default: the config's exp_dir)")
    p.add_argument("--frameworks", nargs="+", default=["tf", "jax"], help="the runs to compare (default: tf jax)")
    args = p.parse_args(argv)
    cfg = config_mod.load_config(args.config, args.yaml_config)
    root = Path(args.exp_dir) if args.exp_dir else cfg.resolve_path(cfg.exp_dir)
    runs = {fw: read_metrics(root / args.config / fw) for fw in args.frameworks}
    if not any(runs.values()):
        raise UserError(
            f"no finished runs under {root / args.config} (expected {', '.join(args.frameworks)}/metrics.jsonl)"
        )
    print(f"config {args.config}: TF and JAX side by side ({root / args.config})")
    print(summary_table(runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
