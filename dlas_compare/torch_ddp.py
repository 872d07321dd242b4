"""PyTorch reference, data parallel (DDP, NCCL), SYNTHETIC mode: one process per GPU.

    torchrun --standalone --nproc_per_node=2 -m dlas_compare.torch_ddp --config short_opt \
        --local_batch_size 64 --out r.jsonl

Each rank trains on its own cached batch of ``local_batch_size`` crops; rank 0 times the windows
(after warm-up, each ended by ``torch.cuda.synchronize``) and appends one record like
:mod:`dlas_compare.benchmark`'s (samples/s counts the global batch).
"""

from __future__ import annotations

import datetime
import json
import os
import shlex
import sys
import time
from collections.abc import Sequence

import numpy as np

from dlas_compare import peaks
from dlas_compare.benchmark import table
from dlas_compare.torch_ref import build_model, make_train_step, params_from_canonical, versions
from shared_data.core import config as config_mod
from shared_data.core import config_cli
from shared_data.core.commands import make_parser
from shared_data.model import unet_spec


def main(argv: Sequence[str] | None = None) -> int:
    import torch
    import torch.distributed as dist

    p = make_parser("dlas_compare.torch_ddp", __doc__.split("\n\n")[0])
    config_cli.add_config_args(p)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--windows", type=int, default=5)
    p.add_argument("--label", default="torch DDP")
    p.add_argument("--out")
    args = p.parse_args(argv)
    cfg = config_cli.config_from_args(args)
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local_rank)
    torch.backends.cudnn.benchmark = True
    _, local_bs = config_mod.batch_sizes(cfg, world)
    model = build_model(cfg).cuda()
    params_from_canonical(model, unet_spec.init_weights(cfg, cfg.seed))
    model = model.to(memory_format=torch.channels_last_3d)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank])
    if cfg.grad_allreduce_dtype == "bfloat16":  # gradients summed in bfloat16, as JAX's and TF's key
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        ddp.register_comm_hook(dist.group.WORLD, default_hooks.bf16_compress_hook)
    step = make_train_step(cfg, ddp, channels_last=False)
    s = cfg.crop_size
    gen = torch.Generator(device="cuda").manual_seed(rank)
    x = (0.1 * torch.randn(local_bs, cfg.N_in_channels, s, s, s, device="cuda", generator=gen)).to(
        memory_format=torch.channels_last_3d
    )
    y = (0.1 * torch.randn(local_bs, cfg.N_out_channels, s, s, s, device="cuda", generator=gen)).to(
        memory_format=torch.channels_last_3d
    )
    t0 = time.perf_counter()
    for _ in range(args.warmup):
        step(x, y)
    torch.cuda.synchronize()
    warm = time.perf_counter() - t0
    per_step = []
    for _ in range(args.windows):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(args.steps):
            step(x, y)
        torch.cuda.synchronize()
        per_step.append((time.perf_counter() - t0) / args.steps)
    if rank == 0:
        per_step = np.array(per_step)
        global_bs = local_bs * world
        rate = float(np.median(global_bs / per_step))
        flops = unet_spec.train_flops_per_sample(cfg)
        device = torch.cuda.get_device_name(0)
        rec = {
            "label": args.label,
            "framework": "torch",
            "mode": "synthetic",
            "config": cfg.name,
            "loader": "cached device batch",
            "precision": cfg.precision,
            "global_batch": global_bs,
            "local_batch": local_bs,
            "replicas": world,
            "crop_size": s,
            "samples_per_sec": rate,
            "step_ms_p50": float(np.percentile(per_step, 50) * 1e3),
            "step_ms_p90": float(np.percentile(per_step, 90) * 1e3),
            "warmup_sec": warm,
            "compile_sec": warm,
            **peaks.utilisation(flops, rate, device, cfg.precision, world),
            "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30,
            "device": f"{world} x {device}",
            "versions": versions(),
            "command": " ".join(shlex.quote(a) for a in sys.argv),
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
        }
        if args.out:
            with open(args.out, "a") as fh:
                fh.write(json.dumps(rec) + "\n")
        print(table([rec]))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
