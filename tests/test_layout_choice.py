"""Weight layouts chosen by what the CPU can do: the pure decision, one test per case, and the
no-AVX-512 path forced in a subprocess so it runs on any machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from selfspec._engine.runner.layout import WeightLayoutError, choose_layout, packing_unsupported
from selfspec._engine.tuning.machine import CpuCapability

AVX2 = CpuCapability(aten="AVX2")  # oneDNN's fp32 kernels, no bf16/fp16 ones
AVX512 = CpuCapability(aten="AVX512", avx512=True, onednn_bf16=True)  # bf16 via BW/VL/DQ
SAPPHIRE = CpuCapability(
    aten="AVX512", avx512=True, avx512_bf16=True, amx=True, onednn_bf16=True, onednn_fp16=True
)
NO_ONEDNN = CpuCapability(aten="AVX2", onednn=False)


@pytest.mark.parametrize("cpu", [AVX2, AVX512, SAPPHIRE], ids=["avx2", "avx512", "amx"])
def test_auto_packs_float32_on_any_cpu_with_onednn(cpu):
    assert choose_layout("auto", "cpu", torch.float32, cpu) == "packed"


def test_auto_falls_back_to_the_model_for_bf16_on_avx2():
    assert choose_layout("auto", "cpu", torch.bfloat16, AVX2) == "model"
    assert choose_layout("auto", "cpu", torch.float16, AVX2) == "model"


def test_auto_packs_bf16_where_onednn_has_bf16_kernels():
    assert choose_layout("auto", "cpu", torch.bfloat16, AVX512) == "packed"
    assert choose_layout("auto", "cpu", torch.float16, AVX512) == "model"  # no fp16 kernels
    assert choose_layout("auto", "cpu", torch.float16, SAPPHIRE) == "packed"


def test_auto_keeps_the_model_in_float64_on_gpus_and_without_onednn():
    assert choose_layout("auto", "cpu", torch.float64, SAPPHIRE) == "model"
    assert choose_layout("auto", "cuda", torch.float32, None) == "model"
    assert choose_layout("auto", "cpu", torch.float32, NO_ONEDNN) == "model"


@pytest.mark.parametrize("layout", ["model", "transposed"])
def test_model_and_transposed_run_everywhere(layout):
    for cpu, device in [(AVX2, "cpu"), (SAPPHIRE, "cpu"), (None, "cuda")]:
        for dtype in (torch.float32, torch.bfloat16, torch.float64):
            assert choose_layout(layout, device, dtype, cpu) == layout


@pytest.mark.parametrize(
    ("device", "dtype", "cpu", "reason"),
    [
        (
            "cpu",
            torch.bfloat16,
            AVX2,
            "bfloat16 kernels need AVX-512 (BW/VL/DQ) or AVX-NE-CONVERT, and this CPU runs AVX2",
        ),
        ("cpu", torch.float16, AVX512, "float16 kernels need AVX-512 FP16"),
        ("cpu", torch.float64, SAPPHIRE, "not float64"),
        ("cpu", torch.float32, NO_ONEDNN, "no oneDNN"),
        ("cuda", torch.float32, None, "CPU only"),
    ],
)
def test_explicit_packed_that_cannot_run_says_why(device, dtype, cpu, reason):
    with pytest.raises(WeightLayoutError, match="cannot run here") as err:
        choose_layout("packed", device, dtype, cpu)
    assert reason in str(err.value) and "\n" not in str(err.value)
    assert packing_unsupported(device, dtype, cpu) is not None


def test_explicit_packed_runs_where_supported_and_unknown_layouts_are_refused():
    assert choose_layout("packed", "cpu", torch.bfloat16, SAPPHIRE) == "packed"
    assert packing_unsupported("cpu", torch.float32, AVX2) is None
    with pytest.raises(WeightLayoutError, match="unknown weight layout"):
        choose_layout("blocked", "cpu", torch.float32, AVX2)


def test_capability_labels():
    assert AVX2.label == "AVX2"
    assert AVX512.label == "AVX-512"
    assert SAPPHIRE.label == "AVX-512 + AMX"


FORCED = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}

_FORCED_SCRIPT = textwrap.dedent("""
    import json, warnings
    import torch
    from selfspec import Decoder
    from selfspec._engine.tuning.machine import cpu_capability, machine_info
    from selfspec._engine.runner.formats import check_layout
    from selfspec._engine.runner.layout import WeightLayoutError
    from selfspec.testing import NearTieWarning, assert_lossless, tiny_model

    cap = cpu_capability()
    out = {"aten": torch.backends.cpu.get_cpu_capability(), "onednn_bf16": cap.onednn_bf16,
           "label": cap.label, "forced": machine_info().get("forced_isa")}
    try:
        check_layout("packed", torch.device("cpu"), torch.bfloat16)
        out["packed_bf16"] = "ran"
    except WeightLayoutError as exc:
        out["packed_bf16"] = str(exc)
    model = tiny_model("llama", dtype=torch.bfloat16)
    decoder = Decoder(model, "vanilla")
    out["auto_bf16"] = decoder.runner.weight_layout
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NearTieWarning)
        result = assert_lossless(model, decoder, [3, 1, 4, 1, 5, 9, 2, 6], 24)
    out["tokens"] = len(result.output_ids)
    out["stats_layout"] = result.stats.weight_layout
    out["auto_fp32"] = Decoder(
        tiny_model("llama", dtype=torch.float32), "vanilla"
    ).runner.weight_layout
    print(json.dumps(out))
""")


def test_forced_avx2_decodes_bf16_losslessly_without_packing():
    """ATEN_CPU_CAPABILITY/ONEDNN_MAX_CPU_ISA really lower what runs (checked, so this covers
    the AVX2 path on an AVX-512 machine too), and bf16 then decodes on the model's weights."""
    env = {**os.environ, **FORCED, "SELFSPEC_CALIBRATE": "0"}  # the capability rule, unmeasured
    proc = subprocess.run(
        [sys.executable, "-c", _FORCED_SCRIPT], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["aten"] == "AVX2" and out["label"] == "AVX2"  # the variables took effect
    assert out["onednn_bf16"] is False
    assert out["forced"] == FORCED
    assert "cannot run here" in out["packed_bf16"]
    assert out["auto_bf16"] == "model" and out["stats_layout"] == "model"
    assert out["tokens"] == 24
    assert out["auto_fp32"] == "packed"
