"""MFU against the datasheet's dense peak of the compute dtype, and the measured matmul rate beside it."""

import pytest

from dlas_compare import peaks


def test_h200_bf16_mfu_is_of_the_datasheet_peak_with_the_measured_rate_beside_it():
    # 1 TFLOP a sample at 394 samples/s is 394 TFLOP/s: 394 / 989.4 of the datasheet, 394 / 788 = 0.5 measured
    u = peaks.utilisation(1e12, 394.0, "1 x NVIDIA H200", "bfloat16")
    assert u["peak_tflops"] == 989.4
    assert u["mfu"] == pytest.approx(394.0 / 989.4, rel=1e-12)
    assert u["mfu_of_measured_matmul"] == pytest.approx(0.5, rel=1e-12)
    # the same rate over two devices is half the utilisation of each
    assert peaks.utilisation(1e12, 394.0, "2 x NVIDIA H200", "bfloat16", devices=2)["mfu"] == pytest.approx(
        197.0 / 989.4, rel=1e-12
    )


@pytest.mark.parametrize(
    ("device", "precision", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", "bfloat16", 989.4),
        ("NVIDIA H100 PCIe", "float16", 756.5),
        ("NVIDIA H200", "float32", 494.7),  # float32 multiplies in TF32 on tensor cores
        ("NVIDIA A100-SXM4-80GB", "bfloat16", 312.0),
        ("NVIDIA A100-PCIE-40GB", "float32", 156.0),
    ],
)
def test_datasheet_peak_by_device_and_compute_dtype(device, precision, peak):
    assert peaks.datasheet_tflops(device, precision) == peak
    u = peaks.utilisation(1e12, peak / 2, device, precision)
    assert u["mfu"] == pytest.approx(0.5, rel=1e-12)
    # the measured rate is known for the H200 in bf16 alone
    assert (u["mfu_of_measured_matmul"] is not None) == ("H200" in device and precision == "bfloat16")


def test_a_cpu_has_no_peak():
    assert peaks.utilisation(1e9, 10.0, "1 x cpu", "float32") == dict.fromkeys(peaks.UTILISATION_KEYS)


def test_the_torch_reference_names_the_library_of_its_convolutions():
    from dlas_compare.torch_ref import conv_library

    cudnn = ["sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_ndhwc_kernel", "elementwise_kernel"]
    native = ["vol2col_kernel<float>", "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", "col2vol_kernel<float>"]
    assert conv_library(cudnn) == "cuDNN"
    assert conv_library(native) == "native"  # vol2col + GEMM is PyTorch's own 3-D convolution
    assert conv_library(["elementwise_kernel", "reduce_kernel"]) == "unknown"
