"""Check the environment this kit runs in: ``python -m dlas_compare.doctor`` (``dlas-doctor``).

One line per check with a verdict (OK, WARN, FAIL, SKIP): Python, the devices each framework sees
(JAX, TensorFlow, PyTorch; each probed in its own process, so one broken install cannot hide the
others), CUDA / cuDNN / NCCL versions where present, whether DALI and its TensorFlow plugin load,
the XLA flags in force, and the installed versions against the pinned ones
(``requirements/constraints-cpu.txt``, or ``-cuda.txt`` on a machine with a GPU; a wheel ships them
as ``shared_data/pins``). Exit code 1 if a check fails, else 0. Takes a few seconds (TensorFlow's
import is the slow one).

``--constraints cpu|cuda`` prints the path of a pins file instead, for pip::

    pip install -c "$(dlas-doctor --constraints cuda)" 'dlas-cosmo[jax-cuda,tf-cuda]'

"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

from shared_data.core.commands import make_parser
from shared_data.core.errors import UserError, run_cli
from shared_data.core.files import check_writable, write_atomic, writing
from shared_data.runtime.xla_flags import DEFAULT_XLA_FLAGS, apply_default_xla_flags

# Each probe prints one JSON object; it runs in a fresh interpreter with a timeout.
PROBES = {
    "jax": """
import json, jax
out = {"version": jax.__version__, "backend": jax.default_backend(), "devices": [str(d) for d in jax.devices()]}
try:
    from jax._src.lib import cuda_versions
    if cuda_versions is not None:
        out["cuda"] = cuda_versions.cuda_runtime_get_version()
        out["cudnn"] = cuda_versions.cudnn_get_version()
except Exception:
    pass
print(json.dumps(out))
""",
    "tensorflow": """
import os, json
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import tensorflow as tf
info = tf.sysconfig.get_build_info()
print(json.dumps({"version": tf.__version__, "devices": [d.name for d in tf.config.list_physical_devices()],
                  "cuda": info.get("cuda_version"), "cudnn": info.get("cudnn_version")}))
""",
    "torch": """
import json, torch
out = {"version": torch.__version__, "cuda_available": torch.cuda.is_available(), "cuda": torch.version.cuda}
if torch.cuda.is_available():
    out["devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    out["cudnn"] = torch.backends.cudnn.version()
    out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
print(json.dumps(out))
""",
    "dali": """
import json, nvidia.dali as d
print(json.dumps({"version": d.__version__}))
""",
    "dali-tf": """
import os, json
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import nvidia.dali.plugin.tf as dali_tf
print(json.dumps({"loaded": True}))
""",
}
MODULES = {"jax": "jax", "tensorflow": "tensorflow", "torch": "torch", "dali": "nvidia.dali", "dali-tf": "tensorflow"}


def probe(name: str, timeout: float = 120) -> tuple[str, dict | str]:
    """Run probe ``name``: ``("ok", result)``, ``("missing", reason)`` or ``("failed", last error line)``."""
    import importlib.util

    try:
        present = importlib.util.find_spec(MODULES[name].split(".")[0]) is not None
        if present and name in ("dali", "dali-tf"):
            present = importlib.util.find_spec("nvidia.dali") is not None
    except (ImportError, ValueError):
        present = False
    if not present:
        return "missing", f"{MODULES[name]} is not installed"
    try:
        res = subprocess.run([sys.executable, "-c", PROBES[name]], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "failed", f"no answer in {timeout:.0f} s"
    if res.returncode != 0:
        lines = [line for line in (res.stderr or res.stdout).strip().splitlines() if line.strip()]
        return "failed", lines[-1] if lines else f"exit code {res.returncode}"
    return "ok", json.loads(res.stdout.strip().splitlines()[-1])


#: The machine kinds that have a pins file: ``constraints-<kind>.txt``.
PIN_KINDS = ("cpu", "cuda")


def pins_file(kind: str) -> Path | None:
    """The pins of machine kind ``kind`` (``cpu`` or ``cuda``): ``requirements/`` of the source tree the
    kit runs from, else the copy the wheel installs as ``shared_data/pins``; None if neither exists."""
    name = f"constraints-{kind}.txt"
    package = Path(__file__).resolve().parent.parent
    for path in (package / "requirements" / name, package / "shared_data" / "pins" / name):
        if path.is_file():
            return path
    return None


def compare_pins(path: Path) -> list[tuple[str, str, str]]:
    """``(package, pinned, installed or 'not installed')`` for every pin of ``path`` that differs."""
    out = []
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if "==" not in line:
            continue
        name, want = (part.strip() for part in line.split("==", 1))
        try:
            have = metadata.version(name)
        except metadata.PackageNotFoundError:
            have = "not installed"
        if have != want:
            out.append((name, want, have))
    return out


def checks() -> list[tuple[str, str, str]]:
    """Every check as ``(what, verdict, detail)``."""
    rows = []
    py = sys.version_info
    rows.append(("python", "OK" if py >= (3, 12) else "FAIL", f"{sys.version.split()[0]} (the pins need 3.12)"))
    smi = shutil.which("nvidia-smi")
    has_gpu = False
    if smi:
        res = subprocess.run(
            [smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        has_gpu = res.returncode == 0 and bool(res.stdout.strip())
        rows.append(
            ("GPUs (nvidia-smi)", "OK" if has_gpu else "WARN", res.stdout.strip().replace("\n", "; ") or "none")
        )
    else:
        rows.append(("GPUs (nvidia-smi)", "SKIP", "no nvidia-smi: a CPU-only machine"))
    for name in ("jax", "tensorflow", "torch"):
        state, out = probe(name)
        if state == "ok":
            devices = out.get("devices", [])
            gpu = [d for d in devices if "gpu" in d.lower() or "cuda" in d.lower() or "nvidia" in d.lower()]
            versions = ", ".join(f"{k} {out[k]}" for k in ("cuda", "cudnn", "nccl") if out.get(k))
            if name == "torch":
                n = len(devices) if out.get("cuda_available") else 0
                verdict = "WARN" if has_gpu and not n else "OK"
            else:
                n = len(devices)
                verdict = "WARN" if has_gpu and not gpu else "OK"
            detail = f"{out['version']}: {n} devices {gpu or devices or ['none']}"
            rows.append((name, verdict, detail + (f"; {versions}" if versions else "")))
        else:
            rows.append((name, "SKIP" if state == "missing" else "FAIL", out))
    for name, what in (("dali", "DALI"), ("dali-tf", "DALI TensorFlow plugin")):
        state, out = probe(name)
        verdict = {"ok": "OK", "missing": "SKIP", "failed": "FAIL"}[state]
        rows.append((what, verdict, out.get("version", "loads") if isinstance(out, dict) else out))
    flags = apply_default_xla_flags(dict(os.environ))
    defaults = all(f.split("=")[0] in flags for f in DEFAULT_XLA_FLAGS)
    tf_adds = [f for f in apply_default_xla_flags(dict(os.environ), framework="tf").split() if f not in flags.split()]
    detail = (flags or "(none)") + (f"; tf_impl adds {' '.join(tf_adds)}" if tf_adds else "")
    rows.append(("XLA_FLAGS in force", "OK" if defaults else "WARN", detail))
    pins = pins_file("cuda" if has_gpu else "cpu")
    if pins is None:
        rows.append(("pinned versions", "FAIL", "no constraints file in the source tree or the installed package"))
    else:
        rows.append(("pinned versions", *pins_verdict(compare_pins(pins), pins)))
    return rows


def pins_verdict(diff: list[tuple[str, str, str]], pins: Path) -> tuple[str, str]:
    """``(verdict, detail)`` of the pins check from :func:`compare_pins`' ``diff``: WARN where an
    installed version differs from its pin; a pinned package that is not installed belongs to an
    extra this environment left out (the test tools without ``[test]``) and is listed, not warned of."""
    differ = [(n, want, have) for n, want, have in diff if have != "not installed"]
    absent = sorted(n for n, _, have in diff if have == "not installed")
    if not differ:
        detail = f"installed versions match {pins}"
    else:
        detail = "; ".join(f"{n} {have} (pinned {want})" for n, want, have in differ[:8])
        detail += f"; and {len(differ) - 8} more" if len(differ) > 8 else ""
        detail += f" ({pins})"
    if absent:
        detail += f"; not installed (extras left out): {', '.join(absent)}"
    return ("WARN" if differ else "OK"), detail


def main(argv: Sequence[str] | None = None) -> int:
    p = make_parser("dlas_compare.doctor", __doc__.split("\n\n")[0])
    p.add_argument("--json", help="also write the checks to this JSON file")
    p.add_argument(
        "--constraints",
        choices=PIN_KINDS,
        help="print the path of the pins for this machine kind (for pip install -c) and exit",
    )
    args = p.parse_args(argv)
    if args.json:  # before the checks, which take seconds
        check_writable(args.json, "--json")
    if args.constraints:
        path = pins_file(args.constraints)
        if path is None:
            raise UserError(f"no constraints-{args.constraints}.txt in the source tree or the installed package")
        print(path)
        return 0
    print("[doctor] checking: each framework imports in its own process (seconds each)", file=sys.stderr, flush=True)
    rows = checks()
    width = max(len(r[0]) for r in rows) + 2
    for what, verdict, detail in rows:
        print(f"{what:<{width}}{verdict:<6}{detail}")
    if args.json:
        with writing(args.json):
            write_atomic(args.json, json.dumps([dict(check=w, verdict=v, detail=d) for w, v, d in rows], indent=1))
    return 1 if any(v == "FAIL" for _, v, _ in rows) else 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
