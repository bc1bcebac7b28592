"""The weight-format registry (``selfspec.weight_formats``, the ``selfspec_weight_formats`` hook).

Set-up, and why:
a) A third-party format is a real installed distribution: a package directory and its
   ``.dist-info`` (with an ``entry_points.txt`` naming the module in the
   ``selfspec.weight_formats`` group) written to a temporary directory put on ``sys.path``,
   which is what ``pip install`` leaves behind; the registry finds it through
   ``importlib.metadata`` as it finds any installed package.
b) Its draft format is a plain float copy, so decoding with it is still verified by the
   model's own weights and stays lossless; its layout is a float copy too (a layout must
   compute the model's own product).
"""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch
from click.testing import CliRunner

import selfspec
from selfspec import Decoder, Runner, WeightFormat, WeightFormatError, draft_weights, weight_formats
from selfspec._engine.drafting.draftweights import resolve_backend, shadow
from selfspec._engine.runner import formats
from selfspec._engine.runner.formats import FormatPackageError, check_layout
from selfspec._engine.runner.layout import WeightLayoutError
from selfspec._engine.tuning import calibration
from selfspec.testing import assert_lossless, tiny_model

PACKAGE = """
import torch
from torch import nn

import selfspec


class CopyLinear(nn.Module):
    def __init__(self, weight, bias):
        super().__init__()
        self.register_buffer("w", weight.detach().clone())
        self.register_buffer("b", None if bias is None else bias.detach().clone())

    def forward(self, x):
        return nn.functional.linear(
            x, self.w.to(x.dtype), None if self.b is None else self.b.to(x.dtype)
        )


def selfspec_weight_formats(register):
    register(selfspec.WeightFormat("acme-copy", "draft", "a plain copy (a test format)", CopyLinear,
                                   runs_on="CPU"))
    register(selfspec.WeightFormat(
        "acme-layout", "layout", "a plain copy laid out (a test format)", CopyLinear,
        unsupported=lambda device, dtype: None if dtype != torch.float16 else "no fp16",
    ))
"""


def _install(root, dist: str, entry: str) -> None:
    """The ``.dist-info`` pip leaves for ``dist``, naming ``entry`` in the formats group (see
    a))."""
    info = root / f"{dist.replace('-', '_')}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n", encoding="utf-8"
    )
    (info / "entry_points.txt").write_text(
        f"[selfspec.weight_formats]\n{entry}\n", encoding="utf-8"
    )


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """A package ``acme_formats`` installed in ``tmp_path`` (see a)), the registry reloaded."""
    (tmp_path / "acme_formats.py").write_text(textwrap.dedent(PACKAGE), encoding="utf-8")
    _install(tmp_path, "acme-formats", "acme = acme_formats")
    monkeypatch.syspath_prepend(str(tmp_path))
    formats.reload_weight_formats()
    monkeypatch.setattr(calibration, "_MEMO", {})
    yield
    sys.modules.pop("acme_formats", None)
    formats.reload_weight_formats()


def test_the_host_registers_library_formats_with_names_that_say_what_they_are():
    found = weight_formats()
    assert list(weight_formats("layout")) == ["model", "transposed", "packed", "packed-mkl"]
    assert {
        "none",
        "int8",
        "int8-dynamic",
        "int8-intmm",
        "int8-weights",
        "int4",
        "fp16-weights",
        "bf16",
        "bnb-int8",
        "bnb-nf4",
    } == set(weight_formats("draft"))
    assert all(f.owner == "selfspec" and f.summary for f in found.values())
    assert {n for n, f in found.items() if f.gated} == {"int4", "bnb-nf4"}
    # no format is named after an instruction set
    assert not any(isa in n for n in found for isa in ("avx", "vnni", "native", "amx", "neon"))


def test_a_format_that_cannot_run_says_why_and_is_refused_with_it():
    assert (
        weight_formats()["int8"].why_not("meta", torch.float32)
        == "it runs on CPU only, the model is on meta"
    )
    with pytest.raises(
        WeightLayoutError, match="'packed-mkl' cannot run here: MKL's packed sgemm is float32 only"
    ):
        check_layout("packed-mkl", torch.device("cpu"), torch.float64)
    with pytest.raises(
        WeightLayoutError, match="unknown weight layout 'native'; choose one of auto, model"
    ):
        check_layout("native", torch.device("cpu"), torch.float32)


def test_a_broken_check_is_a_reason_not_a_crash():
    def boom(device, dtype):
        raise RuntimeError("no such op")

    fmt = WeightFormat("x", "draft", "x", None, unsupported=boom)
    assert fmt.why_not("cpu", torch.float32) == "its check failed (RuntimeError: no such op)"


@pytest.mark.parametrize(
    ("fmt", "message"),
    [
        (WeightFormat("Int8", "draft", "s", None), "lower case"),
        (WeightFormat("auto", "draft", "s", None), "not 'auto'"),
        (WeightFormat("x", "verify", "s", None), "role must be one of"),
        (WeightFormat("int8", "draft", "s", None), "registered twice"),
        ("int8", "not a selfspec.WeightFormat"),
    ],
)
def test_a_malformed_registration_is_refused(fmt, message):
    with pytest.raises(WeightFormatError, match=message):
        formats._check(fmt, "acme", weight_formats())


@pytest.mark.parametrize("layout", ["transposed", "packed", "packed-mkl"])
def test_every_library_layout_computes_the_models_product(layout):
    # a layout keeps verification's product: the same logits up to the summation order
    if formats.weight_format(layout, "layout").why_not("cpu", torch.float32):
        pytest.skip(f"{layout} does not run here")
    model = tiny_model("qwen2", dtype=torch.float32)
    ids = torch.arange(1, 12) % model.config.vocab_size
    want = Runner(model, weight_layout="model").forward(ids).logits
    for rows in (ids[:1], ids):  # one row (packed-mkl's packed copy) and a block
        got = Runner(model, weight_layout=layout).forward(rows).logits
        torch.testing.assert_close(got, want[: len(rows)], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("layout", ["packed", "packed-mkl", "transposed"])
def test_decoding_on_a_library_layout_is_lossless(layout):
    if formats.weight_format(layout, "layout").why_not("cpu", torch.float32):
        pytest.skip(f"{layout} does not run here")
    model = tiny_model("llama", dtype=torch.float32)
    out = Decoder(model, "vanilla", weight_layout=layout).generate(torch.tensor([3, 5, 7]), 12)
    ref = Decoder(model, "vanilla", weight_layout="model").generate(torch.tensor([3, 5, 7]), 12)
    assert out.output_ids == ref.output_ids


def test_hook_weight_formats(installed, monkeypatch):
    """``selfspec_weight_formats``: a third-party format appears in the choices, the listing
    and ``auto``'s candidates."""
    found = weight_formats()
    assert found["acme-copy"].owner == "acme-formats" and found["acme-copy"].role == "draft"
    assert "acme-copy" in selfspec.DRAFT_WEIGHTS and "acme-layout" in formats.format_names("layout")
    assert "acme-copy" in formats.candidates("draft", "cpu", torch.float32)
    assert "acme-layout" in formats.candidates("layout", "cpu", torch.float32)
    assert "acme-layout" not in formats.candidates("layout", "cpu", torch.float16)  # its own check
    # auto measures it beside the host's
    seen = {}
    real = shadow.choose_draft_weights

    def spy(runner, *, static, candidates, **kw):
        seen["draft"] = list(candidates)
        return real(runner, static=static, candidates=candidates, measure=_fake_times(candidates))

    monkeypatch.setattr(shadow, "choose_draft_weights", spy)
    runner = Runner(tiny_model("llama", dtype=torch.float32), weight_layout="model")
    chosen = shadow.measured_backend(runner)
    # the fake timing makes it fastest
    assert "acme-copy" in seen["draft"] and chosen == "acme-copy"
    # the CLI lists it with its package, and --weight-layout takes its layout
    from selfspec.app._cli import cli

    result = CliRunner().invoke(cli, ["plugins"])
    lines = result.output.splitlines()
    assert result.exit_code == 0, "".join(
        __import__("traceback").format_exception(*result.exc_info)
    )
    line = next(x for x in lines if x.split(":")[0].split() == ["draft", "acme-copy"])
    assert "runs here" in line and "[from acme-formats]" in line
    # the choices
    assert any(x.strip().startswith("-o draft_weights=") and "'acme-copy'" in x for x in lines)
    bad = CliRunner().invoke(cli, ["--weight-layout", "acme-nope", "plugins"])
    assert bad.exit_code == 2 and "acme-layout" in bad.output


def test_a_third_party_draft_format_decodes_losslessly(installed):
    model = tiny_model("llama", dtype=torch.float32)
    dw = draft_weights(Runner(model), "acme-copy")
    assert dw.backend == "acme-copy" and dw.layer_bytes > 0  # see b)
    result = assert_lossless(model, "selfsd", [3, 4, 5, 6], 16, {"draft_weights": "acme-copy"})
    assert result.stats.drafted > 0
    assert resolve_backend("acme-copy", torch.device("cpu")) == "acme-copy"


def test_a_package_whose_module_cannot_be_imported_is_named(tmp_path, monkeypatch):
    _install(tmp_path, "broken-fmt", "b = no_such_module_here")
    monkeypatch.syspath_prepend(str(tmp_path))
    formats.reload_weight_formats()
    try:
        with pytest.raises(FormatPackageError, match="broken-fmt.*cannot be imported"):
            weight_formats()
    finally:
        monkeypatch.undo()
        formats.reload_weight_formats()


def _fake_times(candidates):
    """A measurement in which ``acme-copy`` is fastest (the rest as measured would be noise)."""

    def measure(runs, widths):
        return {c: {w: [0.001 if c == "acme-copy" else 0.01] * 3 for w in widths} for c in runs}

    return measure
