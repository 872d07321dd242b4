"""The optimized HLO of the kit's train step, read for :mod:`dlas_compare.step_breakdown`: its
instructions (result shapes, operands, the computation a fusion calls, the source functions each came
from), which of them are convolutions, a convolution's executed FLOPs, role (forward, input gradient,
weight gradient) and U-Net layer, and the kind of every other op (:data:`KINDS`). Text in, plain data
out; no JAX.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence

from shared_data.model import unet_spec

#: Bytes per element of the HLO element types the byte counts know.
DTYPE_BYTES = {"f64": 8, "f32": 4, "bf16": 2, "f16": 2, "s64": 8, "s32": 4, "u32": 4, "s8": 1, "u8": 1, "pred": 1}
#: The kinds of non-convolution ops a breakdown counts (:func:`kind_of`); the last is the rest.
KINDS = (
    "bias and activations",
    "pads",
    "concatenations",
    "depth-to-space shuffles",
    "space-to-depth shuffles",
    "kernel regrouping",
    "casts",
    "loss",
    "Adam",
    "gradient norm",
    "loss scale",
    "layout copies",
    "other",
)


@dataclasses.dataclass
class Instruction:
    """One HLO instruction: name, opcode, result shapes ``[(dtype, dims)]``, operand names, the
    called computation, attributes text, metadata ``op_name`` and source function names (innermost first)."""

    name: str
    opcode: str
    shapes: list
    operands: list
    calls: str | None
    attrs: str
    op_name: str
    functions: list


def _shapes(text: str) -> list:
    return [(t, [int(d) for d in dims.split(",") if d]) for t, dims in re.findall(r"\b([a-z]+\d*)\[([\d,]*)\]", text)]


def nbytes(shapes) -> int:
    """Bytes of the arrays ``shapes`` (``[(dtype, dims)]``, as :class:`Instruction` holds them) of the
    element types of :data:`DTYPE_BYTES`; others count nothing."""
    return sum(DTYPE_BYTES.get(t, 4) * math.prod(d) for t, d in shapes if t in DTYPE_BYTES)


_INSTR = re.compile(r"^\s+(?:ROOT )?%(\S+) = (.+?) ([a-z][\w-]*)\((.*?)\)(.*)$")


def parse_hlo(text: str) -> dict[str, Instruction]:
    """Every instruction of an optimized HLO module (its ``as_text()``), by name, with the source
    function names of its stack frame (the module's FileLocations / StackFrames tables)."""
    functions = dict(re.findall(r"^(\d+) \"(.*)\"$", _section(text, "FunctionNames"), re.M))
    locations = {
        k: v
        for k, v in re.findall(
            r"^(\d+) \{file_name_id=\d+ function_name_id=(\d+)", _section(text, "FileLocations"), re.M
        )
    }
    frames = dict(
        (k, (loc, parent))
        for k, loc, parent in re.findall(
            r"^(\d+) \{file_location_id=(\d+) parent_frame_id=(\d+)", _section(text, "StackFrames"), re.M
        )
    )

    def chain(frame: str | None) -> list:
        out, seen = [], set()
        while frame and frame in frames and frame not in seen:
            seen.add(frame)
            loc, parent = frames[frame]
            out.append(functions.get(locations.get(loc, ""), "?"))
            frame = parent if parent != frame else None
        return out

    instrs = {}
    for line in text.splitlines():
        m = _INSTR.match(line)
        if not m:
            continue
        name, shape_text, opcode, operand_text, attrs = m.groups()
        calls = re.search(r"calls=%([\w.-]+)", attrs)
        op_name = re.search(r'op_name="([^"]*)"', attrs)
        frame = re.search(r"stack_frame_id=(\d+)", attrs)
        instrs[name] = Instruction(
            name,
            opcode,
            _shapes(shape_text),
            re.findall(r"%([\w.-]+)", operand_text),
            calls.group(1) if calls else None,
            attrs,
            op_name.group(1) if op_name else "",
            chain(frame.group(1) if frame else None),
        )
    return instrs


def _section(text: str, title: str) -> str:
    m = re.search(rf"^{title}\n(.*?)(?:\n\n|\Z)", text, re.M | re.S)
    return m.group(1) if m else ""


def computations(text: str) -> dict[str, list[str]]:
    """Instruction names of each computation of the module, by computation name."""
    out, current = {}, None
    for line in text.splitlines():
        head = re.match(r"^(?:ENTRY )?%([\w.-]+) .*\{$", line)
        if head:
            current = head.group(1)
            out[current] = []
            continue
        m = _INSTR.match(line)
        if m and current:
            out[current].append(m.group(1))
    return out


def is_conv(ins: Instruction) -> bool:
    """Whether ``ins`` is a convolution: an HLO ``convolution`` or a cuDNN convolution custom-call."""
    return ins.opcode == "convolution" or (
        ins.opcode == "custom-call" and "conv" in ins.attrs.split("custom_call_target=")[-1][:40]
    )


def layer_of(ins: Instruction, layers: Sequence[str]) -> str | None:
    """The U-Net layer (``down1`` ... ``last``) an instruction belongs to, from its ``op_name`` scope."""
    for part in ins.op_name.split("/"):
        if part in layers:
            return part
    return None


def conv_flops_and_role(ins: Instruction, instrs: dict, batch: int) -> tuple[float, str]:
    """Executed FLOPs of a convolution and its role: ``fwd``, ``dgrad`` (input gradient) or
    ``wgrad`` (weight gradient).

    A cuDNN custom-call names its role (``__cudnn$convBackwardInput`` / ``...Filter``) and describes
    the forward convolution: FLOPs = 2 x elements(forward output) x elements(kernel) / C_out. A plain
    ``convolution`` op is counted as written: 2 x elements(result) x elements(rhs) / rhs C_out; it is
    forward-mode unless its scope is under ``transpose(`` (or it has no scope, as XLA's rewritten
    gradients may), and of the backward ones the one whose result has no batch axis is the weight
    gradient.
    """
    result = next(d for t, d in ins.shapes if t != "u8")
    operands = [next((d for t, d in instrs[o].shapes if t != "u8"), []) for o in ins.operands if o in instrs]
    labels = re.search(r"dim_labels=\w+_(\w+)->\w+", ins.attrs)
    rhs_labels = labels.group(1) if labels else ""
    target = re.search(r'custom_call_target="([^"]+)"', ins.attrs)
    target = target.group(1) if target else ""
    if target:
        if "BackwardFilter" in target:
            role, fwd_out, kernel = "wgrad", operands[1], result
        elif "BackwardInput" in target:
            role, fwd_out, kernel = "dgrad", operands[0], operands[1]
        else:
            role, fwd_out, kernel = "fwd", result, operands[1]
        c_out = kernel[rhs_labels.index("o")] if "o" in rhs_labels else kernel[-1]
        return 2.0 * math.prod(fwd_out) * math.prod(kernel) / max(c_out, 1), role
    rhs = operands[1]
    c_out = rhs[rhs_labels.index("o")] if "o" in rhs_labels else rhs[-1]
    backward = "transpose(" in ins.op_name or not ins.op_name
    role = "fwd" if not backward else ("dgrad" if result[:1] == [batch] else "wgrad")
    return 2.0 * math.prod(result) * math.prod(rhs) / max(c_out, 1), role


def formulation_kernels(cfg) -> dict[str, list]:
    """Per layer, the sorted dims of the kernel its convolutions use (the formulation's: space-to-depth
    (2, 2, 2, 8 C_in, C_out), sub-pixel (2, 2, 2, C_in, 8 C_out), else (4, 4, 4, C_in, C_out)), to find
    the layer of a convolution XLA left without a scope."""
    out, first_up = {}, True
    for s in unet_spec.layer_specs(cfg):
        if s.kind == "down":
            method = unet_spec.conv_method("down", s.in_size, cfg.downconv, cfg.downconv_strided_below)
            dims = [2, 2, 2, 8 * s.c_in, s.c_out] if method == "space_to_depth" else [4, 4, 4, s.c_in, s.c_out]
        else:
            method = unet_spec.conv_method("up", s.in_size, cfg.upconv, cfg.upconv_transpose_below)
            # skip_concat: split runs the [up, skip] input of every up-conv but the first as two halves
            c_in = s.c_in // 2 if cfg.skip_concat == "split" and not first_up else s.c_in
            first_up = False
            dims = {
                "subpixel": [2, 2, 2, c_in, 8 * s.c_out],
                "subpixel_crop": [2, 2, 2, c_in, 8 * s.c_out],
                "phases": [2, 2, 2, c_in, s.c_out],
            }.get(method, [4, 4, 4, c_in, s.c_out])
        out[s.name] = sorted(dims)
    return out


def kind_of(ins: Instruction, fused: list) -> str:
    """The kind of a non-convolution op, from the source functions and primitives of it and of the
    instructions fused into it."""
    names = " ".join(ins.op_name.split("/")[-1:] + [f.op_name.split("/")[-1] for f in fused])
    funcs = set(ins.functions + [fn for f in fused for fn in f.functions])
    text = " ".join(funcs)
    if "scale_by_adam" in text or "apply_updates" in text or "bias_correction" in text or "update_moment" in text:
        return "Adam"
    if "tree_norm" in text:
        return "gradient norm"
    if "dynamic_scale" in text.lower() or "DynamicScale" in text:
        return "loss scale"
    if "loss_fn" in text:
        return "loss"
    if "depth_to_space" in text:
        return "depth-to-space shuffles"
    if "phase_kernel" in text or ("conv_space_to_depth" in text and "gather" in names):
        return "kernel regrouping"
    if "conv_space_to_depth" in text and "pad" not in names:
        return "space-to-depth shuffles"
    if "pad" in names:
        return "pads"
    if "concatenate" in names:
        return "concatenations"
    if any(k in names for k in ("select_n", "max", "add", "leaky_relu", "relu", "tanh")):
        return "bias and activations"
    if "convert" in names:
        return "casts"
    if ins.opcode in ("copy", "transpose") or not ins.op_name:
        return "layout copies"
    return "other"
