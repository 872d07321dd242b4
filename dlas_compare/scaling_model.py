"""Weak scaling on paper: the step time and efficiency of data-parallel training on N GPUs at a fixed
local batch, predicted from the step measured on one GPU and published link rates.

    python -m dlas_compare.scaling_model                 # JAX and TF on 1, 2, 8, 64, 512 H200s
    python -m dlas_compare.scaling_model --check         # the model against the measured 2-GPU runs
    python -m dlas_compare.scaling_model --tutorial      # the tutorial's 128 A100s (PyTorch DDP)

The model. With the local batch fixed, each GPU computes what one GPU computes alone (``t_1``); data
parallelism adds the gradient all-reduce, of which only what does not hide behind compute, and the
compute it slows down where it does hide:

    t_N = t_1 + exposed + contention            efficiency = t_1 / t_N

* **All-reduce time** ``T`` of ``V`` gradient bytes on ``N = g x m`` GPUs (``g`` per node, ``m`` nodes),
  hierarchical: a reduce-scatter inside the node, an all-reduce across nodes of each GPU's ``V / g``
  share through its own NIC (a rail-optimized network), an all-gather inside the node. A ring over
  ``k`` ranks moves ``2 (k - 1) / k`` times the bytes through each rank's link (nccl-tests' bus
  bandwidth factor), so, with the phases in sequence (no pipelining between them, an upper bound):

      T = calls x latency + 2 (g - 1) / g x V / (eta B_node) + 2 (m - 1) / m x V / (g eta B_nic)

  ``B_node`` and ``B_nic`` are the published per-GPU, one-direction link rates; ``eta`` is the share
  of them that NCCL reaches (``link``: all of it; ``measured``: what NCCL reached beside the backward
  pass on two H200s). The latency per call is the alpha-beta model's: per ring hop, or per level of a
  tree across nodes, whichever is less (NCCL's tuner picks the faster algorithm the same way).
* **Overlap.** The framework splits the gradients into ``buckets`` all-reduces and starts them while
  the backward pass still runs, in a ``window`` that ends with the step's compute; the last bucket
  starts when the backward pass ends, so it never hides, nor does what exceeds the window:
  ``overlapped = min(T - T / buckets, window)``, ``exposed = T - overlapped``. TF's multi-replica
  step sums the gradients after the XLA-compiled backward pass (``tf_impl/train.py``): window 0.
* **Contention.** While NCCL's kernels share the GPU with the convolutions, the convolutions slow
  down: ``contention = c x overlapped``, ``c`` measured on two H200s.

Every input (the measured steps, the measured overlap, window and contention, the link rates, the
latencies) is one entry of the tables below with its source. Units: ms, GB = 1e9 bytes, GB/s.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from shared_data.core import config as config_mod
from shared_data.core.commands import make_parser
from shared_data.core.errors import UserError, run_cli
from shared_data.model import unet_spec

GRAD_BYTES = {"float32": 4, "bfloat16": 2}


@dataclasses.dataclass(frozen=True)
class Input:
    """One input of the model: its value and where it comes from (a result file or a publication)."""

    value: float
    source: str


@dataclasses.dataclass(frozen=True)
class Cluster:
    """GPUs and links: ``gpus_per_node`` share the node's links (``node_gbps`` per GPU, one direction);
    each GPU has its own NIC to the other nodes (``nic_gbps``, one direction); ``alpha_*_us`` is the
    latency of one ring hop inside a node and across the network."""

    name: str
    gpus_per_node: int
    node_gbps: Input
    nic_gbps: Input
    alpha_node_us: Input
    alpha_net_us: Input


@dataclasses.dataclass(frozen=True)
class Framework:
    """How a framework's data-parallel step exchanges gradients: its one-GPU step at local batch 64
    (``step_ms``), the share of that step its all-reduces may run beside compute
    (``window_share``), and ``buckets`` all-reduces per step (``None``: buckets of ``bucket_mb``)."""

    name: str
    step_ms: Input
    window_share: Input
    buckets: Input | None = None
    bucket_mb: float = 25.0

    def calls(self, grad_bytes: float) -> int:
        """All-reduce calls per step for ``grad_bytes`` of gradients."""
        if self.buckets is not None:
            return int(self.buckets.value)
        return max(1, math.ceil(grad_bytes / (self.bucket_mb * 1e6)))


ALPHA = "NCCL's tuning model (github.com/NVIDIA/nccl src/graph/tuning.cc @01afd20, hwLat, Ring/Simple)"
H200 = Cluster(
    "HGX H200: 8 GPUs per node (NVLink 4 + NVSwitch), InfiniBand NDR, one NIC per GPU",
    gpus_per_node=8,
    node_gbps=Input(
        450.0,
        "NVLink 4: 900 GB/s per GPU, both directions (18 links; MLCommons record "
        "mlcommons/inference_results_v4.1 closed/NVIDIA/systems/H200-SXM-141GBx8_TRT_MaxQ.json)",
    ),
    nic_gbps=Input(
        50.0,
        "400 Gb/s per GPU, one NIC each, rail-optimized (NVIDIA's HGX H100/H200/B200 AI Factory reference "
        "architecture, '2-8-9-400', there over Spectrum-X Ethernet; InfiniBand NDR has the same 400 Gb/s)",
    ),
    alpha_node_us=Input(3.4, ALPHA + ", NVLink"),
    alpha_net_us=Input(9.6, ALPHA + ", network"),
)
PERLMUTTER = Cluster(
    "Perlmutter GPU node: 4 A100 (NVLink 3), 4 Slingshot-11 NICs",
    gpus_per_node=4,
    node_gbps=Input(300.0, "NVLink 3: 600 GB/s per A100, both directions (12 links, 4 to each of the 3 others)"),
    nic_gbps=Input(
        25.0,
        "4 Slingshot-11 NICs per GPU node (docs.nersc.gov/systems/perlmutter/architecture), "
        "200 Gb/s each (HPE Slingshot's endpoint rate)",
    ),
    alpha_node_us=Input(3.4, ALPHA + ", NVLink"),
    alpha_net_us=Input(9.6, ALPHA + ", network"),
)

STEP_H200 = "experiments/tf_on_h200/results/compare_final.jsonl (short_opt, SYNTHETIC, bf16, batch 64)"
#: XLA's all-reduces start 10.81 ms into a 17.93-ms two-GPU step and run to its end.
JAX_WINDOW = Input(
    (17.93 - 10.81) / 17.93, "experiments/two_gpu_scaling/results/timeline.log (first NCCL kernel of a step)"
)
JAX_BUCKETS = Input(7, "experiments/two_gpu_scaling/results/allreduce_schedules.log (7 combined all-reduces)")
TF_WINDOW = Input(0.0, "tf_impl/train.py: with several replicas the gradient sum runs after the XLA-compiled step")
FRAMEWORKS = {
    "jax": Framework("jax", Input(1e3 * 64 / 4828.958, STEP_H200), JAX_WINDOW, JAX_BUCKETS),
    "tf": Framework("tf", Input(1e3 * 64 / 4831.370, STEP_H200), TF_WINDOW, Input(1, TF_WINDOW.source)),
}
#: The backward pass's share of the step's convolution time (dgrad + wgrad of all convolutions): the
#: window of a framework that starts each bucket as soon as the backward pass produces it (DDP).
BACKWARD_SHARE = Input(
    (4.12 + 3.07) / 10.56, "experiments/h200_step_breakdown/README.md (bf16: fwd 3.38, dgrad 4.12, wgrad 3.07 ms)"
)
#: Compute time per ms of NCCL kernel beside it: (17.37 - 16.83) / 1.64 and (17.54 - 16.83) / 1.41 on the two GPUs.
CONTENTION = Input(
    (17.37 - 16.83 + 17.54 - 16.83) / (1.64 + 1.41),
    "experiments/two_gpu_scaling/results/timeline_with_without_allreduce.log (compute with / without NCCL beside it)",
)
#: NCCL's bus bandwidth beside compute on two H200s: 223.1 MiB per step in 1.99 and 1.53 ms of NCCL kernels.
MEASURED_ETA = Input(
    223.1 * 2**20 / 1e9 / ((1.99 + 1.53) / 2 / 1e3) / H200.node_gbps.value,
    "experiments/two_gpu_scaling/results/timeline_with_without_allreduce.log, allreduce_schedules.log",
)
BANDWIDTHS = {"link": Input(1.0, "the published link rates"), "measured": MEASURED_ETA}

#: The measured two-GPU runs the model is checked against: (framework, one-GPU step ms, two-GPU step
#: ms from samples/s at local batch 64, gradient dtype on the wire).
SCALING = "experiments/two_gpu_scaling/results/scaling.jsonl"
CHECKS = [
    (Framework("jax", Input(1e3 * 64 / 3741.078, SCALING), JAX_WINDOW, JAX_BUCKETS), 1e3 * 128 / 7150.934, "bfloat16"),
    (Framework("ddp", Input(1e3 * 64 / 1892.522, SCALING), BACKWARD_SHARE), 1e3 * 128 / 3723.181, "float32"),
]
#: The tutorial (NERSC sc22-dl-tutorial README, "Weak and Strong Throughput Scaling"): PyTorch DDP,
#: bs64_opt, local batch 64, one A100 at 782.2 samples/s (its AMP + APEX + JIT run), about 84% on
#: 32 nodes (128 A100s) with real data, 12% communication overhead with synthetic data.
TUTORIAL = Framework(
    "ddp",
    Input(1e3 * 64 / 782.2, "NERSC sc22-dl-tutorial README (epoch 4 of the AMP, APEX and JIT run)"),
    BACKWARD_SHARE,
)
TUTORIAL_GPUS, TUTORIAL_EFFICIENCY = 128, 0.84


def allreduce_ms(grad_bytes: float, gpus: int, cluster: Cluster, eta: float = 1.0, calls: int = 1) -> float:
    """Time in ms of ``calls`` all-reduces summing ``grad_bytes`` bytes in all over ``gpus`` GPUs.

    Hierarchical (reduce-scatter in the node, all-reduce across nodes through each GPU's NIC,
    all-gather in the node), each ring moving ``2 (k - 1) / k`` times the bytes per rank (nccl-tests'
    bus bandwidth), the links at ``eta`` of their rate; plus per call the lesser of a ring's
    ``2 (N - 1)`` hops and a tree's ``2 (g - 1)`` node hops plus ``2 ceil(log2 m)`` network levels.
    Raises ``UserError`` when ``gpus`` is below 1, or more than one node but not whole nodes.
    """
    if gpus < 1:
        raise UserError(f"{gpus} GPUs: a GPU count is a positive integer")
    g = min(gpus, cluster.gpus_per_node)
    if gpus > g and gpus % g:
        raise UserError(f"{gpus} GPUs: more than one node needs whole nodes of {g} GPUs")
    m = gpus // g
    if gpus == 1:
        return 0.0
    node = 2 * (g - 1) / g * grad_bytes / (eta * cluster.node_gbps.value * 1e9)
    net = 2 * (m - 1) / m * grad_bytes / (g * eta * cluster.nic_gbps.value * 1e9)
    a_node, a_net = cluster.alpha_node_us.value, cluster.alpha_net_us.value
    ring = 2 * (gpus - m) * a_node + 2 * (m - 1) * a_net
    tree = 2 * (g - 1) * a_node + 2 * math.ceil(math.log2(m)) * a_net
    return 1e3 * (node + net) + calls * min(ring, tree) / 1e3


@dataclasses.dataclass(frozen=True)
class Prediction:
    """One row: ``gpus`` replicas of ``framework`` summing ``grad_dtype`` gradients (times in ms)."""

    framework: str
    grad_dtype: str
    gpus: int
    compute: float
    allreduce: float
    exposed: float
    contention: float

    @property
    def step(self) -> float:
        """The predicted step on ``gpus`` GPUs, ms."""
        return self.compute + self.exposed + self.contention

    @property
    def efficiency(self) -> float:
        """Samples/s per GPU against one GPU's (weak scaling)."""
        return self.compute / self.step


def predict(
    fw: Framework, params: int, grad_dtype: str, gpus: int, cluster: Cluster, eta: float, c: float
) -> Prediction:
    """The step of ``fw`` on ``gpus`` GPUs of ``cluster`` (see the module docstring for the model)."""
    grad_bytes = params * GRAD_BYTES[grad_dtype]
    calls = fw.calls(grad_bytes)
    total = allreduce_ms(grad_bytes, gpus, cluster, eta, calls)
    t1 = fw.step_ms.value
    overlapped = min(total - total / calls, fw.window_share.value * t1)
    exposed = total - overlapped
    return Prediction(fw.name, grad_dtype, gpus, t1, total, exposed, c * overlapped)


def table(rows: Sequence[Prediction]) -> str:
    """The predictions as a text table."""
    head = f"{'framework':<10}{'grads':<10}{'GPUs':>6}{'all-reduce':>12}{'exposed':>9}{'contention':>12}"
    head += f"{'step':>8}{'efficiency':>12}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r.framework:<10}{r.grad_dtype:<10}{r.gpus:>6}{r.allreduce:>12.2f}{r.exposed:>9.2f}"
            f"{r.contention:>12.2f}{r.step:>8.2f}{100 * r.efficiency:>11.1f}%"
        )
    return "\n".join(lines)


def inputs_text(cluster: Cluster, frameworks: Sequence[Framework], params: int) -> str:
    """Every input of a table, one line each with its source."""
    lines = [f"cluster: {cluster.name}", f"  parameters: {params} (shared_data/model/unet_spec.py, short_opt)"]
    for name in ("node_gbps", "nic_gbps", "alpha_node_us", "alpha_net_us"):
        item = getattr(cluster, name)
        lines.append(f"  {name}: {item.value:g} ({item.source})")
    for fw in frameworks:
        lines.append(f"  {fw.name} step_ms: {fw.step_ms.value:.2f} ({fw.step_ms.source})")
        lines.append(f"  {fw.name} window_share: {fw.window_share.value:.3f} ({fw.window_share.source})")
        calls = f"{fw.buckets.value:g} ({fw.buckets.source})" if fw.buckets else f"buckets of {fw.bucket_mb:g} MB"
        lines.append(f"  {fw.name} all-reduces per step: {calls}")
    lines.append(f"  contention c: {CONTENTION.value:.3f} ms per ms of NCCL beside compute ({CONTENTION.source})")
    lines.append(f"  eta 'measured': {MEASURED_ETA.value:.3f} of the link rate ({MEASURED_ETA.source})")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = make_parser("dlas_compare.scaling_model", description=__doc__.split("\n\n")[0])
    p.add_argument("--gpus", type=int, nargs="+", help="GPU counts to predict (default 1 2 8 64 512; tutorial 1 4 128)")
    p.add_argument("--nic_gbps", type=float, help="override the per-GPU network rate, GB/s one direction")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="the model against the measured 2-GPU runs")
    mode.add_argument("--tutorial", action="store_true", help="the tutorial's cluster: 128 A100s, PyTorch DDP")
    args = p.parse_args(argv)
    if args.gpus and any(n < 1 for n in args.gpus):
        raise UserError(f"--gpus {' '.join(map(str, args.gpus))}: GPU counts are positive integers")
    if args.nic_gbps is not None and not (0 < args.nic_gbps < math.inf):  # nan fails both
        raise UserError(f"--nic_gbps {args.nic_gbps}: a rate in GB/s is a positive finite number")
    params = unet_spec.num_params(config_mod.load_config("short_opt"))
    c = CONTENTION.value
    cluster, frameworks, dtypes, gpus = H200, list(FRAMEWORKS.values()), ("float32", "bfloat16"), [1, 2, 8, 64, 512]
    if args.tutorial:
        cluster, frameworks, dtypes, gpus = PERLMUTTER, [TUTORIAL], ("float32",), [1, 4, TUTORIAL_GPUS]
    gpus = args.gpus or gpus
    if args.nic_gbps is not None:
        cluster = dataclasses.replace(cluster, nic_gbps=Input(args.nic_gbps, "--nic_gbps"))
    if args.check:
        print("two H200s, local batch 64: measured against predicted")
        for fw, measured, dtype in CHECKS:
            for name, eta in BANDWIDTHS.items():
                r = predict(fw, params, dtype, 2, cluster, eta.value, c)
                print(
                    f"  {fw.name:<4}{dtype:<9} 1 GPU {fw.step_ms.value:.2f} ms, 2 GPUs measured {measured:.2f} ms "
                    f"({100 * fw.step_ms.value / measured:.1f}%), predicted at {name} bandwidth {r.step:.2f} ms "
                    f"({100 * r.efficiency:.1f}%)"
                )
        return 0
    print(inputs_text(cluster, frameworks, params))
    for name, eta in BANDWIDTHS.items():
        rows = [predict(fw, params, d, n, cluster, eta.value, c) for fw in frameworks for d in dtypes for n in gpus]
        print(f"\nbandwidth '{name}' (eta {eta.value:.3f}); times in ms per step")
        print(table(rows))
    if args.tutorial:
        print(f"\nthe tutorial reports about {100 * TUTORIAL_EFFICIENCY:.0f}% on {TUTORIAL_GPUS} A100s (real data)")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
