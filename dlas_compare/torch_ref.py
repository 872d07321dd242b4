"""PyTorch reference: the tutorial's U-Net and training step with the tutorial's GPU practices
(AMP autocast, ``channels_last_3d``, fused Adam, ``cudnn.benchmark``; optional ``torch.compile``).

It exists to be measured against (``dlas_compare.benchmark --framework torch``), and loads the canonical
weights file, so its outputs can be checked against TF and JAX. Imports torch only inside functions
that need it, so the comparison tools import without torch and skip its row.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from shared_data.core import loader_kinds
from shared_data.core.config import Config
from shared_data.core.errors import MissingDependencyError, UserError
from shared_data.model.unet_spec import encoder_widths, layer_specs


def build_model(cfg: Config):
    """The tutorial's ``UNet`` in PyTorch (NCDHW), layer names ``down1`` ... ``last`` as the spec."""
    import torch
    from torch import nn

    class UNet(nn.Module):
        def __init__(self):
            super().__init__()
            specs = layer_specs(cfg)
            self.n = len(encoder_widths(cfg))
            self.convs = nn.ModuleDict()
            for s in specs:
                conv = nn.Conv3d if s.kind == "down" else nn.ConvTranspose3d
                self.convs[s.name] = conv(s.c_in, s.c_out, 4, 2, 1)
                nn.init.normal_(self.convs[s.name].weight, 0.0, 0.02)
                nn.init.zeros_(self.convs[s.name].bias)

        def forward(self, x):
            skips = []
            for i in range(self.n):
                x = nn.functional.leaky_relu(self.convs[f"down{i + 1}"](x), 0.01)
                skips.append(x)
            for j in range(self.n - 1):
                x = torch.relu(self.convs[f"up{self.n - 1 - j}"](x))
                x = torch.cat([x, skips[self.n - 2 - j]], dim=1)
            return torch.tanh(self.convs["last"](x).float())

    return UNet()


def params_from_canonical(model, weights: dict[str, np.ndarray]) -> None:
    """Load canonical arrays: conv (k, k, k, in, out) -> (out, in, k, k, k); transposed conv
    (k, k, k, in, out) -> (in, out, k, k, k) (PyTorch's ``ConvTranspose3d`` weight layout)."""
    import torch

    with torch.no_grad():
        for name, conv in model.convs.items():
            w = weights[f"{name}/kernel"]
            perm = (4, 3, 0, 1, 2) if name.startswith("down") else (3, 4, 0, 1, 2)
            conv.weight.copy_(torch.from_numpy(np.ascontiguousarray(w.transpose(perm))))
            conv.bias.copy_(torch.from_numpy(weights[f"{name}/bias"]))


def make_train_step(cfg: Config, model, lr: float = 2e-4, compile_model: bool = False, channels_last: bool = True):
    """A training step ``step(x, y) -> loss`` (x, y NCDHW on the GPU): bf16/fp16 autocast when
    ``cfg.enable_amp`` (GradScaler for fp16), fused Adam, L1 loss (+ lambda_rho term)."""
    import torch

    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(cfg.precision)
    if channels_last:
        model = model.to(memory_format=torch.channels_last_3d)
    net = torch.compile(model) if compile_model else model
    opt = torch.optim.Adam(model.parameters(), lr=lr, betas=(0.9, 0.999), eps=1e-8, fused=True)
    scaler = torch.amp.GradScaler("cuda", enabled=dtype == torch.float16)

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
            pred = net(x)
            loss = torch.mean(torch.abs(pred.float() - y))
            if cfg.lambda_rho:
                d, s = cfg.density_channel, cfg.density_scale
                loss = loss + cfg.lambda_rho * torch.mean(
                    torch.abs(torch.exp(s * pred[:, d].float()) - torch.exp(s * y[:, d]))
                )
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss

    return step


def require_torch():
    """Import torch or raise :class:`MissingDependencyError` naming the extra to install."""
    try:
        import torch
    except ImportError:
        raise MissingDependencyError("the PyTorch reference needs torch: pip install -e '.[torch]'") from None
    return torch


def versions() -> dict | None:
    try:
        import torch
    except ImportError:
        return None
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
    }


#: Kernel-name fragments of cuDNN's convolution kernels (its own names and the xmma / implicit-GEMM
#: kernels it runs on Ampere and Hopper) and of PyTorch's native 3-D convolution (vol2col + GEMM).
CUDNN_MARKS = ("cudnn", "xmma", "implicit_gemm", "implicit_convolve", "fprop", "dgrad", "wgrad")
NATIVE_MARKS = ("vol2col", "col2vol", "slow_conv3d", "im2col")


def conv_library(kernel_names: Sequence[str]) -> str:
    """Which library ran a step's 3-D convolutions, from its CUDA kernel names: ``"native"`` where a
    vol2col/col2vol kernel ran (PyTorch's own convolution, which cuDNN being off or refusing the
    shapes leaves), else ``"cuDNN"`` where a cuDNN kernel ran, else ``"unknown"``."""
    names = [n.lower() for n in kernel_names]
    if any(m in n for n in names for m in NATIVE_MARKS):
        return "native"
    if any(m in n for n in names for m in CUDNN_MARKS):
        return "cuDNN"
    return "unknown"


def step_kernels(torch, train_step, batch, top: int = 12) -> dict:
    """Profile one call of ``train_step(*batch)`` with ``torch.profiler`` (CUDA activity); return
    ``kernels`` (the ``top`` CUDA kernels by total time: [name, ms]) and ``conv_library``
    (:func:`conv_library` over every kernel that ran)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        train_step(*batch)
        torch.cuda.synchronize()
    rows = [(e.key, e.device_time_total / 1e3) for e in prof.key_averages() if e.device_time_total > 0]
    rows.sort(key=lambda r: -r[1])
    kernels = [[name, round(ms, 3)] for name, ms in rows[:top]]
    return {"kernels": kernels, "conv_library": conv_library([name for name, _ in rows])}


def check_input(cfg: Config, mode: str) -> None:
    """Refuse an input the reference cannot read in benchmark ``mode``.

    Raises:
        UserError: ``dali-device`` outside SYNTHETIC (its crop callback is JAX's and TF's).
    """
    kind = loader_kinds.loader_kind(cfg)
    if kind.dali and kind.device_volumes and mode != "synthetic":
        raise UserError(
            "the PyTorch reference has no dali-device input (its crop callback is JAX's and "
            "TF's); use dali-npy, dali-h5 or a native loader"
        )


class Bench:
    """The PyTorch reference in the benchmark modes (see :mod:`dlas_compare.benchmark`). FULL and IO read
    through the same shared DALI pipelines (``nvidia.dali.plugin.pytorch``) or the NumPy loader.

    ``step_from``: a Bench whose train step (model, optimizer, cudnn's autotuned algorithms) this one
    takes over instead of building and autotuning its own; ``input_from``: one whose input pipeline
    it takes over."""

    framework = "torch"

    def __init__(
        self,
        cfg: Config,
        mode: str,
        num_devices: int | None = None,
        compile_model: bool = False,
        step_from=None,
        input_from=None,
    ):
        import time

        check_input(cfg, mode)
        torch = require_torch()
        from shared_data.model.unet_spec import init_weights

        if not torch.cuda.is_available():
            raise UserError("the PyTorch reference is measured on a GPU only, and torch sees none")
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        self.torch, self.cfg, self.mode = torch, cfg, mode
        self.global_batch = cfg.local_batch_size or cfg.global_batch_size
        self.compile_sec, self.compiled_step = 0.0, False
        self._out = None
        s, b = cfg.crop_size, self.global_batch
        if mode in ("io", "full"):
            self.batches = input_from.batches if input_from else self._batches()
        if mode in ("synthetic", "full") and step_from is not None:
            self.train_step, self.batch = step_from.train_step, step_from.batch
        elif mode in ("synthetic", "full"):
            model = build_model(cfg).cuda()
            params_from_canonical(model, init_weights(cfg, cfg.seed))
            self.train_step = make_train_step(cfg, model, compile_model=compile_model)
            x = torch.randn(b, cfg.N_in_channels, s, s, s, device="cuda").to(memory_format=torch.channels_last_3d) * 0.1
            y = (
                torch.randn(b, cfg.N_out_channels, s, s, s, device="cuda").to(memory_format=torch.channels_last_3d)
                * 0.1
            )
            self.batch = (x, y)
            t0 = time.perf_counter()
            for _ in range(3):  # cudnn.benchmark autotuning (and torch.compile) happen in the first steps
                self.train_step(x, y)
            torch.cuda.synchronize()
            self.compile_sec, self.compiled_step = time.perf_counter() - t0, True

    def _batches(self):
        import itertools

        torch, cfg = self.torch, self.cfg
        if loader_kinds.loader_kind(cfg).dali:
            from nvidia.dali.plugin.pytorch import DALIGenericIterator

            from shared_data.data import dali_pipelines as dp
            from shared_data.data import dataset
            from shared_data.data.sampler import TRAIN

            path = cfg.data_file("train")
            size = dataset.validate(path, cfg.N_in_channels, cfg.N_out_channels, cfg.crop_size).size
            plans = dp.EpochPlans(cfg, TRAIN, [0], 1, size)
            sources = dp.crop_sources(plans, path, cfg) if loader_kinds.loader_kind(cfg).crops_outside_dali else None
            pipe = dp.build_pipeline(cfg, "train", self.global_batch, 0, plans, sources)
            it = DALIGenericIterator([pipe], list(dp.OUTPUTS), auto_reset=True)
            for _ in itertools.count():
                for out in it:
                    yield out[0]["inputs"].permute(0, 4, 1, 2, 3), out[0]["targets"].permute(0, 4, 1, 2, 3)
        from shared_data.data import crop_readers, host_batches
        from shared_data.data.sampler import TRAIN

        reader = crop_readers.make_reader(cfg)
        workers = host_batches.crop_workers(reader, cfg)  # lowmem: worker processes, as JAX and TF
        try:
            for epoch in itertools.count():
                plan = host_batches.make_plan(cfg, TRAIN, epoch, [0], 1, reader.size)
                for b in host_batches.NumpyLoader(reader, plan, cfg, workers=workers):
                    x = torch.from_numpy(b["inputs"]).pin_memory().cuda(non_blocking=True)
                    y = torch.from_numpy(b["targets"]).pin_memory().cuda(non_blocking=True)
                    yield x.permute(0, 4, 1, 2, 3), y.permute(0, 4, 1, 2, 3)
        finally:
            if workers is not None:
                workers.close()

    def step(self) -> None:
        if self.mode == "io":
            self._out = next(self.batches)
            return
        x, y = self.batch if self.mode == "synthetic" else next(self.batches)
        self._out = self.train_step(x, y)

    def sync(self) -> None:
        self.torch.cuda.synchronize()

    def peak_memory_bytes(self) -> int | None:
        return int(self.torch.cuda.max_memory_allocated())

    def versions(self) -> dict:
        """PyTorch, CUDA and cuDNN versions and, where this bench trains, ``step_kernels`` of one more
        step (which kernels ran and whether the 3-D convolutions ran on cuDNN)."""
        found = versions() or {}
        if self.mode != "io" and "step_kernels" not in self.__dict__:
            self.step_kernels = step_kernels(self.torch, self.train_step, self.batch)
        if self.mode != "io":
            found["step_kernels"] = self.step_kernels
            found["cudnn_enabled"] = bool(self.torch.backends.cudnn.enabled)
        return found

    def device_name(self) -> str:
        return f"1 x {self.torch.cuda.get_device_name(0)}"
