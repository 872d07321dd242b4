"""Every lesson mapped to its code: each ``file.py:name`` reference of the README, of docs/lessons.md and
of ``dlas_compare.side_by_side.LESSONS`` names a function or class that exists; each lesson section of
the README names its TF code, its JAX code and the shared code they call; the side-by-side page holds
both frameworks' source."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dlas_compare import side_by_side
from shared_data.core.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = re.compile(r"`((?:tf_impl|jax_impl|shared_data|dlas_compare)/[\w/]+\.py:[\w.]+)`")
#: The README's lesson sections (headings) and the side-by-side lesson each one names.
SECTIONS = {
    "### The training loop": "loop",
    "### 1. Profile first": "profile",
    "### 2. Fix the input pipeline": "input",
    "### 3. Mixed precision and compilation": "precision",
    "### 4. Scale out": "scale",
    "### 5. Checkpoints": "checkpoint",
}


def references(path: Path) -> list[str]:
    return REFERENCE.findall(path.read_text())


def section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start)
    following = [i for i in (text.find("\n### ", start + 1), end) if i != -1]
    return text[start : min(following)]


@pytest.mark.parametrize("doc", ["README.md", "docs/lessons.md"])
def test_every_code_reference_resolves(doc):
    refs = references(ROOT / doc)
    assert len(refs) >= 20, f"{doc} names only {len(refs)} pieces of code"
    for ref in refs:
        assert side_by_side.source_of(ref), ref


def test_every_lesson_of_the_tool_resolves_in_both_frameworks():
    for name, lesson in side_by_side.LESSONS.items():
        for tf_ref, jax_ref in lesson.pairs:
            assert tf_ref.startswith("tf_impl/") and jax_ref.startswith("jax_impl/"), name
            assert side_by_side.source_of(tf_ref) and side_by_side.source_of(jax_ref)
        for ref in lesson.shared:
            assert side_by_side.summary(ref), f"{ref} has no docstring"


def test_each_readme_lesson_names_tf_jax_and_shared_code():
    text = (ROOT / "README.md").read_text()
    for heading, lesson in SECTIONS.items():
        refs = REFERENCE.findall(section(text, heading))
        tops = {ref.split("/")[0] for ref in refs}
        assert {"tf_impl", "jax_impl"} <= tops and tops & {"shared_data", "dlas_compare"}, heading
        assert f"--lesson {lesson}" in section(text, heading), heading


def test_a_reference_that_does_not_resolve_is_one_line():
    with pytest.raises(UserError, match="defines no no_such_function"):
        side_by_side.source_of("jax_impl/train.py:no_such_function")
    with pytest.raises(UserError, match=r"expected file\.py:name"):
        side_by_side.source_of("jax_impl/train.py")
    with pytest.raises(UserError, match=r"no file jax_impl/none\.py"):
        side_by_side.source_of("jax_impl/none.py:main")


def test_source_of_cuts_out_the_definition():
    lines = side_by_side.source_of("jax_impl/ema.py:averaged")
    assert lines[0] == "@contextlib.contextmanager" and lines[1].startswith("def averaged(state)")
    assert lines[-1].strip() == "yield state.params if state.ema_params is None else state.ema_params"
    method = side_by_side.source_of("shared_data/runtime/position.py:Position.kept")
    assert method[0].strip().startswith("def kept(self)") and len(method) == 5


def test_the_side_by_side_page_holds_both_sources(tmp_path):
    out = tmp_path / "loop.html"
    assert side_by_side.main(["--lesson", "loop", "--out", str(out)]) == 0
    page = out.read_text()
    assert page.count('<table class="diff"') == 2
    assert "tf_impl/train.py:train_epoch" in page and "jax_impl/train.py:train_epoch" in page
    assert "jax.block_until_ready" in page and "distribute.sync_devices" in page  # each framework's input wait
    assert "shared_data/runtime/run_folder.py:RunFolder" in page and "</html>" in page
