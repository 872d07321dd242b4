"""A lesson's TensorFlow and JAX code side by side, read from the source: ``python -m dlas_compare.side_by_side``.

Each lesson of the tutorial (profile first, fix the input pipeline, mixed precision, compilation,
scale out, and the training loop that holds them) lives in a few functions of ``tf_impl/`` and
``jax_impl/`` with the same names, and the shared functions they call. :data:`LESSONS` names them as
``file.py:name`` references (``name`` a top-level function or class, or ``Class.method``); this
command cuts each pair out of the source and writes an HTML page with the two columns aligned line
by line (``difflib.HtmlDiff``), the shared functions listed below. The README's lesson sections and
``docs/lessons.md`` use the same references; ``tests/test_lessons.py`` checks that every one resolves.

    python -m dlas_compare.side_by_side --list
    python -m dlas_compare.side_by_side --lesson loop --out results/side_by_side/loop.html
    python -m dlas_compare.side_by_side --tf tf_impl/ema.py:averaged --jax jax_impl/ema.py:averaged --out ema.html
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import difflib
import html
import sys
from collections.abc import Sequence
from pathlib import Path

from shared_data.core.commands import make_parser
from shared_data.core.errors import UserError, run_cli
from shared_data.core.files import write_atomic, writing

ROOT = Path(__file__).resolve().parent.parent


@dataclasses.dataclass(frozen=True)
class Lesson:
    """One lesson: ``title``, the (TF, JAX) reference pairs that hold it, the shared references they call."""

    title: str
    pairs: tuple[tuple[str, str], ...]
    shared: tuple[str, ...] = ()


def _twin(ref: str) -> tuple[str, str]:
    """The TF and JAX references of ``file.py:name`` (a file of the same name in each framework)."""
    return f"tf_impl/{ref}", f"jax_impl/{ref}"


#: The lessons, in the tutorial's order, each the code a learner reads for it.
LESSONS: dict[str, Lesson] = {
    "loop": Lesson(
        "The training loop: the run folder, the state, resume, the compiled steps, then per epoch "
        "train, validate, checkpoint and judge",
        (_twin("train.py:train_and_evaluate"), _twin("train.py:train_epoch")),
        (
            "shared_data/runtime/run_folder.py:RunFolder",
            "shared_data/runtime/resume.py:resume",
            "shared_data/runtime/steps.py:epoch_steps",
            "shared_data/runtime/epoch_report.py:EpochReport",
            "shared_data/runtime/saves.py:saving",
            "shared_data/inference/quality_check.py:Monitor",
        ),
    ),
    "profile": Lesson(
        "Profile first: NVTX ranges around the input wait and the step, the profiler's capture window",
        (_twin("train.py:train_epoch"), _twin("train.py:capture_window")),
        (
            "shared_data/runtime/nvtx.py:nvtx_range",
            "shared_data/runtime/nvtx.py:step_range",
            "shared_data/runtime/nvtx.py:capture_window",
            "dlas_compare/step_breakdown.py:breakdown",
        ),
    ),
    "input": Lesson(
        "Fix the input pipeline: the loaders, the device loader's gather inside the step, DALI",
        (
            _twin("data.py:make_input"),
            _twin("data.py:crops"),
            _twin("dali.py:DaliInput"),
            ("tf_impl/dali.py:DaliDeviceInput", "jax_impl/dali.py:DaliInput"),
        ),
        (
            "shared_data/runtime/steps.py:EpochTiming",
            "shared_data/data/host_batches.py:make_plan",
            "shared_data/data/dali_pipelines.py:build_pipeline",
            "shared_data/data/dali_pipelines.py:warp_tables",
        ),
    ),
    "precision": Lesson(
        "Mixed precision: the compute dtype of the layers, float32 parameters, fp16's dynamic loss scale",
        (
            ("tf_impl/step.py:make_optimizer", "jax_impl/step.py:create_train_state"),
            ("tf_impl/step.py:replica_gradients", "jax_impl/step.py:train_step"),
            _twin("model.py:build_model"),
        ),
        ("shared_data/core/config_schema.py:Config.precision",),
    ),
    "compile": Lesson(
        "Compilation: the steps compiled once by XLA, ahead of the first epoch; XLA's options set in one place",
        (
            _twin("step.py:compile_steps"),
            ("tf_impl/step.py:step_functions", "jax_impl/step.py:train_step"),
            _twin("distribute.py:configure_xla"),
        ),
        ("shared_data/runtime/xla_flags.py:apply_default_xla_flags",),
    ),
    "scale": Lesson(
        "Scale out: processes joined, replicas over devices, the gradients summed, a stop agreed by every rank",
        (
            _twin("cluster.py:initialize"),
            ("tf_impl/distribute.py:make_strategy", "jax_impl/distribute.py:make_mesh"),
            _twin("distribute.py:num_replicas"),
            ("tf_impl/step.py:replica_gradients", "jax_impl/distribute.py:batch_sharding"),
            ("tf_impl/step.py:apply_gradients", "jax_impl/distribute.py:put_batch"),
            _twin("distribute.py:any_process"),
        ),
        (
            "shared_data/data/sampler.py:epoch_draws",
            "shared_data/model/schedule.py:initial_lr",
            "shared_data/runtime/preemption.py:stop_agreed",
        ),
    ),
    "checkpoint": Lesson(
        "Checkpoints: written in the background and atomically each epoch, a stop's save at a step "
        "boundary, the resume that verifies what it restores",
        (_twin("checkpoints.py:Checkpoints"), _twin("train.py:train_epoch")),
        (
            "shared_data/runtime/saves.py:saving",
            "shared_data/runtime/checksums.py:record",
            "shared_data/runtime/resume.py:resume",
            "shared_data/runtime/preemption.py:stopping",
        ),
    ),
}


def _node(tree: ast.Module, name: str) -> ast.AST | None:
    """The top-level function or class ``name`` of ``tree``, or ``Class.method``."""
    scope: Sequence[ast.AST] = tree.body
    found = None
    for part in name.split("."):
        found = next(
            (
                n
                for n in scope
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == part
            ),
            None,
        )
        if found is None:
            return None
        scope = getattr(found, "body", [])
    return found


def _resolve(ref: str, root: Path) -> tuple[ast.AST, list[str]]:
    """The definition ``ref`` names and the lines of its file.

    Raises:
        UserError: the reference is malformed, its file is missing, or the file defines no ``name``.
    """
    path_text, sep, name = ref.partition(":")
    if not sep or not path_text.endswith(".py") or not name:
        raise UserError(f"reference {ref!r}: expected file.py:name (a function, class or Class.method)")
    path = root / path_text
    if not path.is_file():
        raise UserError(f"reference {ref!r}: no file {path_text} in {root}")
    text = path.read_text()
    node = _node(ast.parse(text, str(path)), name)
    if node is None:
        raise UserError(f"reference {ref!r}: {path_text} defines no {name}")
    return node, text.splitlines()


def source_of(ref: str, root: Path = ROOT) -> list[str]:
    """The source lines of ``ref`` (``path/to/file.py:name``, relative to ``root``), decorators included.

    Raises:
        UserError: the reference is malformed, its file is missing, or the file defines no ``name``.
    """
    node, lines = _resolve(ref, root)
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return lines[first - 1 : node.end_lineno]


def summary(ref: str, root: Path = ROOT) -> str:
    """The first paragraph of ``ref``'s docstring (raises as :func:`source_of` for a reference that does
    not resolve)."""
    doc = ast.get_docstring(_resolve(ref, root)[0]) or ""
    return " ".join(doc.split("\n\n")[0].split())


def page(title: str, pairs: Sequence[tuple[str, str]], shared: Sequence[str] = (), root: Path = ROOT) -> str:
    """An HTML page: for each (TF, JAX) pair the two sources in aligned columns, then the shared references."""
    differ = difflib.HtmlDiff(tabsize=4, wrapcolumn=100)
    parts = [f"<h1>{html.escape(title)}</h1>"]
    for tf_ref, jax_ref in pairs:
        parts.append(differ.make_table(source_of(tf_ref, root), source_of(jax_ref, root), tf_ref, jax_ref))
    if shared:
        items = "".join(
            f"<li><code>{html.escape(ref)}</code>: {html.escape(summary(ref, root))}</li>" for ref in shared
        )
        parts.append(f"<h2>Shared by both frameworks</h2><ul>{items}</ul>")
    head = differ.make_file([], []).split("<body>")[0]  # HtmlDiff's page head: the styles of its tables
    head = head.replace("<title></title>", f"<title>{html.escape(title)}</title>")
    return f"{head}<body>\n" + "\n<br>\n".join(parts) + "\n</body>\n</html>\n"


def build_parser() -> argparse.ArgumentParser:
    p = make_parser(
        "dlas_compare.side_by_side",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="lessons: " + ", ".join(LESSONS),
    )
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--lesson", choices=list(LESSONS), help="a lesson of the tutorial (--list shows them)")
    what.add_argument("--tf", help="a TF reference, file.py:name (with --jax)")
    what.add_argument("--list", action="store_true", help="print the lessons and their references")
    p.add_argument("--jax", help="the JAX reference beside --tf")
    p.add_argument("--out", help="the HTML page to write (default results/side_by_side/<lesson>.html)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.list:
        for name, lesson in LESSONS.items():
            print(f"{name}: {lesson.title}")
            for tf_ref, jax_ref in lesson.pairs:
                print(f"  TF  {tf_ref}\n  JAX {jax_ref}")
            for ref in lesson.shared:
                print(f"  shared {ref}")
        return 0
    if args.tf and not args.jax:
        raise UserError("--tf needs --jax (the JAX reference to set beside it)")
    if args.lesson:
        lesson = LESSONS[args.lesson]
        title, pairs, shared = lesson.title, lesson.pairs, lesson.shared
    else:
        title, pairs, shared = f"{args.tf} | {args.jax}", ((args.tf, args.jax),), ()
    text = page(title, pairs, shared)
    out = Path(args.out or f"results/side_by_side/{args.lesson or 'pair'}.html")
    with writing(out):
        out.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(out, text)
    print(f"wrote {out}: {len(pairs)} pair(s) of TF and JAX code side by side")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
