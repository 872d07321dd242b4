"""Peak rates that MFU divides by: each device's datasheet dense peak for the compute dtype, and,
beside it, the matrix-product rate measured on the device the kit's results come from.

MFU (model FLOPs utilisation) is the model's training FLOPs per second over the datasheet's dense
(no structured sparsity) tensor-core peak of the dtype the matrix products run in, the convention of
PaLM (Chowdhery et al. 2022, appendix B) and of MLPerf write-ups. The compute dtype of a run is its
``precision``: ``bfloat16`` and ``float16`` as named; ``float32`` runs its convolutions and matrix
products on TF32 tensor cores (the default of JAX, TensorFlow and PyTorch's cuDNN convolutions on
Ampere and Hopper), so its peak is the TF32 one.

Sources (dense peaks; the datasheets print the sparse ones, twice these):
* H100 SXM5 and H200 SXM: NVIDIA H100 Tensor Core GPU Architecture whitepaper (table 1: BF16/FP16
  989.4 TFLOP/s, TF32 494.7) and the H200 datasheet (the same tensor cores and clocks: BF16 1979
  with sparsity); H100 PCIe: the same whitepaper (756.5 and 378).
* A100 SXM4 / PCIe: NVIDIA A100 Tensor Core GPU datasheet (BF16/FP16 312, TF32 156).
* The measured rate: a bf16 8192^3 matrix product on the H200 of the kit's results, 788 TFLOP/s
  (0.80 of the datasheet's); a fraction of it is labelled "of the measured matmul rate".
"""

from __future__ import annotations

#: Datasheet dense tensor-core peaks in TFLOP/s by device-name substring (first match wins, so the
#: more specific names come first) and compute dtype.
DATASHEET_TFLOPS: dict[str, dict[str, float]] = {
    "H100 PCIe": {"bfloat16": 756.5, "float16": 756.5, "tf32": 378.0},
    "H100": {"bfloat16": 989.4, "float16": 989.4, "tf32": 494.7},
    "H200": {"bfloat16": 989.4, "float16": 989.4, "tf32": 494.7},
    "A100": {"bfloat16": 312.0, "float16": 312.0, "tf32": 156.0},
}

#: Measured bf16 matrix-product rates in TFLOP/s by device-name substring.
MEASURED_MATMUL_TFLOPS: dict[str, float] = {"H200": 788.0}


#: The keys of :func:`utilisation`'s record (None in a record that measures no step: IO).
UTILISATION_KEYS = ("mfu", "peak_tflops", "mfu_of_measured_matmul")


def compute_dtype(precision: str) -> str:
    """The dtype a run of ``precision`` (``float32`` / ``bfloat16`` / ``float16``) multiplies in:
    ``float32`` is ``tf32`` on tensor cores."""
    return "tf32" if precision == "float32" else precision


def _lookup(table: dict, device: str):
    return next((value for key, value in table.items() if key in device), None)


def datasheet_tflops(device: str, precision: str) -> float | None:
    """The datasheet dense peak (TFLOP/s) of ``device`` (a name such as ``NVIDIA H200``) for the
    compute dtype of ``precision``; None for a device not in :data:`DATASHEET_TFLOPS` (a CPU)."""
    peaks = _lookup(DATASHEET_TFLOPS, device)
    return peaks.get(compute_dtype(precision)) if peaks else None


def measured_tflops(device: str, precision: str) -> float | None:
    """The measured bf16 matrix-product rate of ``device`` (TFLOP/s) for a bf16 run; None otherwise."""
    return _lookup(MEASURED_MATMUL_TFLOPS, device) if compute_dtype(precision) == "bfloat16" else None


def utilisation(flops_per_sample: float, samples_per_sec: float, device: str, precision: str, devices: int = 1) -> dict:
    """MFU of a rate on ``devices`` devices: ``mfu`` (of the datasheet peak), ``peak_tflops`` (that
    peak), ``mfu_of_measured_matmul`` (of :data:`MEASURED_MATMUL_TFLOPS`' rate); each None where the
    device has no such number. ``flops_per_sample`` in FLOP, ``samples_per_sec`` over all devices."""
    achieved = flops_per_sample * samples_per_sec / devices / 1e12
    peak, measured = datasheet_tflops(device, precision), measured_tflops(device, precision)
    return {
        "mfu": achieved / peak if peak else None,
        "peak_tflops": peak,
        "mfu_of_measured_matmul": achieved / measured if measured else None,
    }
