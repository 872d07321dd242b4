"""The step breakdown: per-layer convolution FLOPs and times, the other kernels by kind, from a real
CPU trace of the tiny net and from a hand-made GPU-style module (cuDNN custom-calls) and trace."""

from __future__ import annotations

import gzip
import json

import pytest

from dlas_compare import step_breakdown, step_breakdown_hlo
from shared_data.core import config as config_mod
from shared_data.model import unet_spec


def _forward_flops(cfg, batch):
    """Independent count of each layer's forward convolution as the kit's formulations execute it:
    space-to-depth down-conv 2 B (n/2)^3 x 2^3 x 8 C_in x C_out; sub-pixel up-conv over the padded
    input 2 B (n+1)^3 x 2^3 x C_in x 8 C_out."""
    out = {}
    for s in unet_spec.layer_specs(cfg):
        n = s.in_size
        voxels = (n // 2) ** 3 if s.kind == "down" else (n + 1) ** 3
        out[s.name] = 2 * batch * voxels * 64 * s.c_in * s.c_out
    return out


@pytest.mark.slow
def test_cpu_trace_of_the_tiny_net(tiny_cfg, tmp_path, capsys):
    cfg = config_mod.replace(tiny_cfg, local_batch_size=3)
    assert (
        step_breakdown.main(
            [
                "--config",
                "cpu_tiny",
                "--yaml_config",
                str(config_mod.DEFAULT_YAML),
                "--local_batch_size",
                "3",
                "--set",
                f"train_path={cfg.train_path}",
                "--set",
                f"val_path={cfg.val_path}",
                "--set",
                f"xla_cache_dir={cfg.xla_cache_dir}",
                "--steps",
                "2",
                "--warmup",
                "1",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    result = json.loads((tmp_path / "breakdown.json").read_text())
    assert (tmp_path / "trace.json.gz").stat().st_size > 0 and "ENTRY" in (tmp_path / "hlo.txt").read_text()
    hlo = (tmp_path / "hlo.txt").read_text()
    instrs = step_breakdown_hlo.parse_hlo(hlo)
    convs = [i for i in instrs.values() if step_breakdown_hlo.is_conv(i)]
    want = _forward_flops(cfg, 3)
    got = {}
    for ins in convs:
        flops, role = step_breakdown_hlo.conv_flops_and_role(ins, instrs, 3)
        layer = step_breakdown_hlo.layer_of(ins, list(want))
        if role == "fwd":
            got[layer] = got.get(layer, 0) + flops
    assert got == want
    t = result["totals"]
    assert t["kernel_ms"] == pytest.approx(t["conv_ms"] + t["other_ms"] + t["unmatched_ms"], rel=1e-6)
    assert t["conv_ms"] > 0 and t["other_ms"] > 0 and t["busy_ms"] <= t["span_ms"] + 1e-9
    assert all(result["layers"][n]["fwd"]["ms"] > 0 for n in want)
    # --from_dir re-reads the saved trace and HLO (also gzipped) to the same breakdown
    (tmp_path / "hlo.txt.gz").write_bytes(gzip.compress(hlo.encode()))
    (tmp_path / "hlo.txt").unlink()
    assert step_breakdown.main(["--from_dir", str(tmp_path)]) == 0
    assert json.loads((tmp_path / "breakdown.json").read_text())["totals"] == pytest.approx(t)
    assert result["layers"]["down1"]["dgrad"]["ms"] == 0  # no input gradient for the first layer
    assert result["kinds"]["Adam"]["ms"] > 0 and result["kinds"]["depth-to-space shuffles"]["ms"] > 0
    again = step_breakdown.main(["--from_dir", str(tmp_path)])
    assert again == 0 and json.loads((tmp_path / "breakdown.json").read_text())["layers"] == result["layers"]
    # a CPU trace says what its numbers are and prints no TFLOP/s (its parts overlap, its convolutions are
    # their dispatch)
    printed = capsys.readouterr().out
    assert printed.count("note: a CPU trace") == 3
    rows = [line.split("|") for line in printed.splitlines() if line.startswith("| down1 ")]
    assert rows and all(r[6].strip() == "-" and r[7].strip() == "-" for r in rows)
    assert step_breakdown.on_gpu("1 x NVIDIA H200") and not step_breakdown.on_gpu("1 x cpu")


GPU_HLO = """HloModule jit_train_step

FunctionNames
1 "train_step"
2 "scale_by_adam.<locals>.update_fn"
3 "depth_to_space"

FileLocations
1 {file_name_id=1 function_name_id=1 line=1 end_line=1 column=1 end_column=2}
2 {file_name_id=1 function_name_id=2 line=2 end_line=2 column=1 end_column=2}
3 {file_name_id=1 function_name_id=3 line=3 end_line=3 column=1 end_column=2}

StackFrames
1 {file_location_id=1 parent_frame_id=1}
2 {file_location_id=2 parent_frame_id=1}
3 {file_location_id=3 parent_frame_id=1}

%fused_adam (a: f32[1000], b: f32[1000]) -> f32[1000] {
  %a = f32[1000]{0} parameter(0)
  %b = f32[1000]{0} parameter(1)
  ROOT %m = f32[1000]{0} multiply(%a, %b), metadata={op_name="jit(train_step)/mul" stack_frame_id=2}
}

%fused_d2s (y: bf16[64,8,8,8,128]) -> bf16[64,8,8,8,128] {
  %y = bf16[64,8,8,8,128]{4,3,2,1,0} parameter(0)
  ROOT %t = bf16[64,8,8,8,128]{4,3,2,1,0} transpose(%y), dimensions={0,1,2,3,4}, metadata={op_name="jit(train_step)/jvp(UNet)/up3/transpose" stack_frame_id=3}
}

ENTRY %main (x: bf16[64,9,9,9,256], w: bf16[2,2,2,256,128], dy: bf16[64,8,8,8,128], p: f32[1000], g: f32[1000]) -> f32[1000] {
  %x = bf16[64,9,9,9,256]{4,3,2,1,0} parameter(0)
  %w = bf16[2,2,2,256,128]{4,3,2,1,0} parameter(1)
  %dy = bf16[64,8,8,8,128]{4,3,2,1,0} parameter(2)
  %p = f32[1000]{0} parameter(3)
  %g = f32[1000]{0} parameter(4)
  %fwd = (bf16[64,8,8,8,128]{4,3,2,1,0}, u8[100]{0}) custom-call(%x, %w), window={size=2x2x2}, dim_labels=b012f_012io->b012f, custom_call_target="__cudnn$convForward", metadata={op_name="jit(train_step)/jvp(UNet)/down3/down3/conv_general_dilated" stack_frame_id=1}
  %dx = (bf16[64,9,9,9,256]{4,3,2,1,0}, u8[100]{0}) custom-call(%dy, %w), window={size=2x2x2}, dim_labels=b012f_012io->b012f, custom_call_target="__cudnn$convBackwardInput", metadata={op_name="jit(train_step)/transpose(jvp(UNet))/down3/down3/conv_general_dilated" stack_frame_id=1}
  %dw = (bf16[2,2,2,256,128]{4,3,2,1,0}, u8[100]{0}) custom-call(%x, %dy), window={size=2x2x2}, dim_labels=b012f_012io->b012f, custom_call_target="__cudnn$convBackwardFilter", metadata={op_name="jit(train_step)/transpose(jvp(UNet))/down3/down3/conv_general_dilated" stack_frame_id=1}
  %d2s = bf16[64,8,8,8,128]{4,3,2,1,0} fusion(%dy), kind=kLoop, calls=%fused_d2s
  ROOT %adam = f32[1000]{0} fusion(%p, %g), kind=kLoop, calls=%fused_adam
}
"""


def _gpu_trace():
    meta = [
        {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/device:GPU:0"}},
        {"ph": "M", "pid": 2, "name": "process_name", "args": {"name": "/host:CPU"}},
    ]

    def k(op, ts, dur, pid=1):
        return {"ph": "X", "pid": pid, "tid": 7, "ts": ts, "dur": dur, "name": "kernel", "args": {"hlo_op": op}}

    # two steps of 1000 us (fwd 300, dx 200, dw 250, d2s 100, adam 50; 100 us idle), and host events to ignore
    events = list(meta)
    for step in range(2):
        t = 1000 * step
        events += [
            k("fwd", t, 300),
            k("dx", t + 300, 200),
            k("dw", t + 500, 250),
            k("d2s", t + 750, 100),
            k("adam", t + 850, 50),
            k("fwd", t, 9999, pid=2),
        ]
    return events


def test_gpu_style_module_roles_flops_and_kinds():
    cfg = config_mod.load_config("base")
    result = step_breakdown.breakdown(GPU_HLO, _gpu_trace(), 2, cfg, 64, "1 x NVIDIA H200")
    down3 = result["layers"]["down3"]
    # forward output 64 x 8^3 x 128, kernel 2^3 x 256 x 128: 2 x 4194304 x 262144 / 128 FLOPs
    flops = 2 * (64 * 8**3 * 128) * (8 * 256 * 128) / 128
    for role, ms in (("fwd", 0.3), ("dgrad", 0.2), ("wgrad", 0.25)):
        assert down3[role]["ms"] == pytest.approx(ms)
        assert down3[role]["gflop"] == pytest.approx(flops / 1e9)
        assert down3[role]["tflops"] == pytest.approx(flops / 1e9 / ms)
        # a float32 step multiplies in TF32: the H200 datasheet dense TF32 peak is 494.7 TFLOP/s
        assert down3[role]["peak_share"] == pytest.approx(flops / 1e9 / ms / 494.7)
    assert result["kinds"]["depth-to-space shuffles"]["ms"] == pytest.approx(0.1)
    assert result["kinds"]["Adam"]["ms"] == pytest.approx(0.05)
    assert result["kinds"]["Adam"]["gb"] == pytest.approx(3 * 4000 / 1e9)  # two f32[1000] read, one written
    t = result["totals"]
    assert t["span_ms"] == pytest.approx(0.95) and t["busy_ms"] == pytest.approx(0.9)
    assert t["kernel_ms"] == pytest.approx(0.9) and t["unmatched_ms"] == 0
    # MFU over the 0.95 ms span (GFLOP / ms = TFLOP/s) against TF32's 494.7; no measured TF32 matmul rate
    assert t["mfu"] == pytest.approx(t["model_gflop"] / 0.95 / 494.7) and t["mfu_of_measured_matmul"] is None
    assert "| down3 | 0.30 | 0.20 | 0.25 |" in step_breakdown.tables(result)


def test_a_trace_without_hlo_ops_is_one_error():
    from shared_data.core.errors import UserError

    with pytest.raises(UserError, match="no kernel events naming an HLO instruction"):
        step_breakdown.kernel_times([{"ph": "X", "pid": 1, "ts": 0, "dur": 1, "name": "python"}], 1)


def test_kernels_inside_a_command_buffer_map_to_their_fusions():
    """A kernel run from an XLA command buffer names the buffer (``command_buffer_2``, not an
    instruction of the module's text) as its hlo_op and its fusion, with ``.`` written ``_``, as its
    own name: it is attributed to the fusion; a kernel name that matches no instruction stays on the
    buffer."""
    meta = {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/device:GPU:0"}}

    def k(op, name, ts, dur):
        return {"ph": "X", "pid": 1, "tid": 7, "ts": ts, "dur": dur, "name": name, "args": {"hlo_op": op}}

    events = [meta, k("fwd", "cudnn_conv", 0, 300), k("command_buffer_2", "loop_add_fusion_3", 300, 40)]
    events += [k("command_buffer_2", "input_reduce_fusion_1", 340, 20), k("command_buffer_2", "memset", 360, 10)]
    instructions = {"fwd": None, "loop_add_fusion.3": None, "input_reduce_fusion.1": None}
    per_op, totals = step_breakdown.kernel_times(events, 2, instructions)
    assert per_op == pytest.approx(
        {"fwd": 150e-6, "loop_add_fusion.3": 20e-6, "input_reduce_fusion.1": 10e-6, "command_buffer_2": 5e-6}
    )
    assert totals["span_s"] == pytest.approx(185e-6) and totals["busy_s"] == pytest.approx(185e-6)
