"""The ``native`` weight layout: a float32 product kernel compiled for this CPU at first use.

What is tested: the kernel's products against a float64 product for any shape, block width and
bias; a row's result bitwise independent of its block and of the thread count; the panel
layout's exact round trip; the kernel's building helpers (panels, 4-bit quantization and panels)
bitwise equal to their torch definitions; the fallbacks for inputs it does not compute; why it cannot run
(switched off, no compiler, a failing build); every instruction-set branch of its source and what ``check_layout``/``auto`` then do; a
runner, an adopting runner, a lossless decode and the exact mode on it.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from selfspec._engine.runner import Runner, native, native_copies
from selfspec._engine.runner.layout import WeightLayoutError, check_layout, choose_layout
from selfspec.testing import assert_lossless, tiny_model

WHY = native.native_unsupported()
needs_native = pytest.mark.skipif(WHY is not None, reason=f"the native kernel cannot run here: {WHY}")


@pytest.fixture
def fresh_kernel(monkeypatch, tmp_path):
    """An empty kernel cache and no kernel loaded in this process (restored afterwards)."""
    monkeypatch.setenv("SELFSPEC_CACHE_DIR", str(tmp_path))
    saved = dict(native._STATE)
    native._STATE.clear()
    yield tmp_path
    native._STATE.clear()
    native._STATE.update(saved)


# ------------------------------------------------------------------------------ the kernel
@needs_native
@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 30), out_f=st.integers(1, 150), in_f=st.integers(1, 90), bias=st.booleans(),
       seed=st.integers(0, 2**16))
def test_products_equal_a_float64_product_for_any_shape_width_and_bias(rows, out_f, in_f, bias, seed):
    gen = torch.Generator().manual_seed(seed)
    lin = nn.Linear(in_f, out_f, bias=bias)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(out_f, in_f, generator=gen))
        if bias:
            lin.bias.copy_(torch.randn(out_f, generator=gen))
    x = torch.randn(1, rows, in_f, generator=gen)
    y = native_copies.NativeLinear(lin)(x)
    ref = x.double() @ lin.weight.double().T + (lin.bias.double() if bias else 0)
    assert y.shape == (1, rows, out_f) and y.dtype == torch.float32
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5 * in_f**0.5)


@needs_native
@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 20), out_f=st.integers(1, 100), in_f=st.integers(1, 150),
       group=st.sampled_from([4, 32, 64]), bias=st.booleans(), seed=st.integers(0, 2**16))
def test_4bit_products_equal_a_float64_product_of_the_dequantized_weights(rows, out_f, in_f, group, bias, seed):
    gen = torch.Generator().manual_seed(seed)
    width, groups = native.tile_q(), -(-in_f // group)
    codes = torch.randint(0, 16, (out_f, in_f), generator=gen, dtype=torch.uint8)
    scale, offset = torch.rand(out_f, groups, generator=gen), torch.randn(out_f, groups, generator=gen)
    b = torch.randn(out_f, generator=gen) if bias else None
    x = torch.randn(rows, in_f, generator=gen)
    y = native.native_linear_int4(x, native.to_int4_panels(codes, width), native.to_group_panels(scale, width),
                                  native.to_group_panels(offset, width), group, b, out_f)
    g = torch.arange(in_f) // group
    ref = x.double() @ (codes.double() * scale.double()[:, g] + offset.double()[:, g]).T
    ref = ref + (b.double() if bias else 0)
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-4 * in_f**0.5)


VNNI_WHY = native.vnni_unsupported() if WHY is None else WHY
needs_vnni = pytest.mark.skipif(VNNI_WHY is not None, reason=f"the int8vnni products cannot run here: {VNNI_WHY}")


@needs_vnni
@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 20), out_f=st.integers(1, 100), in_f=st.integers(1, 150), bias=st.booleans(),
       seed=st.integers(0, 2**16), spread=st.sampled_from([1.0, 1e-3, 1e3]))
def test_vnni_products_stay_within_the_rounding_bound_of_their_activations(rows, out_f, in_f, bias, seed, spread):
    # each activation is rounded to within half its row's step (16-bit up to VNNI_FINE_ROWS rows,
    # 8-bit beyond); the products themselves are exact integer sums
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(-127, 128, (out_f, in_f), generator=gen, dtype=torch.int8)
    panels, colsum = native.to_vnni_panels(q)
    scale = torch.zeros(panels.shape[0] * native.VNNI_TILE)
    scale[:out_f] = torch.rand(out_f, generator=gen) * spread
    b = torch.randn(out_f, generator=gen) if bias else None
    x = torch.randn(rows, in_f, generator=gen) * spread
    y = native.native_linear_i8vnni(x, panels, colsum, scale, b, out_f)
    w = q.double() * scale[:out_f].double()[:, None]
    err = (y.double() - (x.double() @ w.T + (b.double() if bias else 0))).abs()
    assert y.shape == (rows, out_f) and y.dtype == torch.float32
    bound = native.vnni_error_bound(x, w) + 1e-6 * (b.double().abs() if bias else 0)
    assert (err <= bound).all(), float((err - bound).max())
    assert torch.equal(colsum, torch.nn.functional.pad(q.sum(1, dtype=torch.int32), (0, colsum.numel() - out_f)))


@needs_vnni
@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 14), out_f=st.integers(1, 80), in_f=st.integers(1, 300), group=st.sampled_from([4, 32, 128]),
       bias=st.booleans(), seed=st.integers(0, 2**16))
def test_4bit_vnni_products_stay_within_the_rounding_bound_of_their_activations(rows, out_f, in_f, group, bias, seed):
    gen = torch.Generator().manual_seed(seed)
    groups = -(-in_f // group)
    codes = torch.randint(0, 16, (out_f, in_f), generator=gen, dtype=torch.uint8)
    scale, offset = torch.rand(out_f, groups, generator=gen), torch.randn(out_f, groups, generator=gen)
    b = torch.randn(out_f, generator=gen) if bias else None
    x = torch.randn(rows, in_f, generator=gen)
    panels, gsum = native.to_int4_vnni_panels(codes, group)
    y = native.native_linear_i4vnni(x, panels, gsum, native.to_group_panels(scale, native.VNNI_TILE),
                                    native.to_group_panels(offset, native.VNNI_TILE), group, b, out_f)
    g = torch.arange(in_f) // group
    coded = codes.double() * scale.double()[:, g]  # the offsets meet exact sums of x
    w = coded + offset.double()[:, g]
    err = (y.double() - (x.double() @ w.T + (b.double() if bias else 0))).abs()
    bound = native.vnni_error_bound(x, coded) + 1e-6 * (x.double().abs() @ w.abs().T) * 4 + 1e-5
    assert (err <= bound).all(), float((err - bound).max())
    padded = torch.zeros(gsum.shape[0] * native.VNNI_TILE, groups * group, dtype=torch.int32)
    padded[:out_f, :in_f] = codes.int()
    sums = padded.view(-1, groups, group).sum(-1).view(gsum.shape[0], native.VNNI_TILE, groups).transpose(1, 2)
    assert torch.equal(gsum, sums)  # each output row's sum of codes per group
    with pytest.raises(ValueError, match="multiple of 4"):
        native.to_int4_vnni_panels(codes, 6)


@needs_vnni
def test_vnni_rows_are_independent_within_each_rounding_of_the_activations():
    gen = torch.Generator().manual_seed(3)
    q = torch.randint(-127, 128, (2 * native.VNNI_TILE + 5, 70), generator=gen, dtype=torch.int8)
    panels, colsum = native.to_vnni_panels(q)
    scale = torch.rand(panels.shape[0] * native.VNNI_TILE, generator=gen)
    x = torch.randn(19, 70, generator=gen)

    def product(rows: torch.Tensor) -> torch.Tensor:
        return native.native_linear_i8vnni(rows.contiguous(), panels, colsum, scale, None, q.shape[0])

    fine = native.VNNI_FINE_ROWS
    alone = torch.cat([product(x[i : i + 1]) for i in range(fine)])
    assert torch.equal(product(x[:fine]), alone)  # 16-bit activations: a row alone or with the fine block's
    assert torch.equal(torch.cat([product(x[:9]), product(x[9:])]), product(x))  # 8-bit: any wider block
    assert not torch.equal(product(x[: fine + 1])[:fine], alone)  # a wider product rounds them coarser


@needs_native
@pytest.mark.parametrize("rows", [2, 7, 13, 33])
def test_a_row_is_bitwise_the_same_alone_in_any_block_and_with_any_thread_count(rows):
    gen = torch.Generator().manual_seed(rows)
    lin = native_copies.NativeLinear(nn.Linear(200, 3 * native.tile() + 9))
    x = torch.randn(rows, 200, generator=gen)
    block = lin(x)
    alone = torch.cat([lin(x[i : i + 1]) for i in range(rows)])
    assert torch.equal(block, alone)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2 if threads == 1 else 1)
        assert torch.equal(lin(x), block)
    finally:
        torch.set_num_threads(threads)


@needs_native
def test_panels_hold_the_weight_exactly_and_count_its_bytes():
    lin = nn.Linear(37, 2 * native.tile() + 3)
    nl = native_copies.NativeLinear(lin)
    assert nl.panels.shape == (3, 37, native.tile())  # the last panel padded with zero rows
    assert torch.equal(nl.weight, lin.weight.detach()) and nl.bias is lin.bias
    assert nl.nbytes() == 37 * lin.out_features * 4
    assert "native panels" in repr(nl)


@needs_native
def test_inputs_it_does_not_compute_run_the_plain_product_on_the_same_weight():
    lin = nn.Linear(16, 24)
    nl = native_copies.NativeLinear(lin)
    x64 = torch.randn(3, 16, dtype=torch.float64)
    torch.testing.assert_close(nl(x64), nn.functional.linear(x64, lin.weight.double(), lin.bias.double()),
                               rtol=1e-6, atol=1e-6)
    xg = torch.randn(3, 16, requires_grad=True)
    nl(xg).sum().backward()  # differentiable: the plain product
    torch.testing.assert_close(xg.grad, lin.weight.detach().sum(0).expand(3, 16))
    strided = torch.randn(16, 5).t()  # not contiguous
    torch.testing.assert_close(nl(strided), lin(strided), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------ when it cannot run
def test_switched_off_it_says_so_and_an_explicit_native_layout_is_refused(monkeypatch, fresh_kernel):
    monkeypatch.setenv(native.ENV, "0")
    assert native.native_unsupported() == f"{native.ENV}=0"
    with pytest.raises(WeightLayoutError, match=f"'native' cannot run here: {native.ENV}=0"):
        check_layout("native", torch.device("cpu"), torch.float32)
    assert not list(fresh_kernel.glob("kernels/*"))  # nothing was built


def test_other_devices_and_dtypes_are_refused_without_building(fresh_kernel):
    assert native.native_unsupported("cuda", torch.float32) == "it runs on CPU only, not cuda"
    assert native.native_unsupported("cpu", torch.bfloat16) == "it computes in float32 only, not bfloat16"
    with pytest.raises(WeightLayoutError, match="float32 only, not float64"):
        check_layout("native", torch.device("cpu"), torch.float64)
    assert "lib" not in native._STATE


def test_without_a_compiler_it_says_so(monkeypatch, fresh_kernel):
    monkeypatch.setenv("CC", "")
    monkeypatch.setenv("PATH", str(fresh_kernel))  # no cc, gcc or clang on it
    assert "no C compiler found" in native.native_unsupported()
    with pytest.raises(RuntimeError, match="cannot run here: no C compiler"):
        native.tile()


def test_a_build_that_fails_says_so(monkeypatch, fresh_kernel):
    broken = fresh_kernel / "broken-cc"
    broken.write_text("#!/bin/sh\necho 'broken-cc: cannot compile' >&2\nexit 1\n")
    broken.chmod(0o755)
    monkeypatch.setenv("CC", str(broken))
    why = native.native_unsupported()
    assert why.startswith(f"compiling the native kernel with {broken} failed") and "cannot compile" in why


def test_the_layout_rule_is_pure_and_auto_never_picks_native_unmeasured():
    assert choose_layout("native", "cpu", torch.float32, None, native_why=None) == "native"
    with pytest.raises(WeightLayoutError, match="'native' cannot run here: no compiler"):
        choose_layout("native", "cpu", torch.float32, None, native_why="no compiler")
    assert choose_layout("auto", "cpu", torch.float64, None, native_why=None) == "model"


@needs_native
def test_a_built_kernel_is_kept_and_reused(monkeypatch, fresh_kernel, capsys):
    assert native.native_unsupported() is None
    assert "compiling the native float32 kernel" in capsys.readouterr().err
    built = list(fresh_kernel.glob("kernels/native-*.so"))
    assert len(built) == 1
    native._STATE.clear()  # another process
    assert native.native_unsupported() is None
    assert capsys.readouterr().err == "" and list(fresh_kernel.glob("kernels/native-*.so")) == built


def _cpu_flags() -> set[str]:
    try:
        text = open("/proc/cpuinfo").read()
    except OSError:
        return set()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return set(line.split(":", 1)[-1].split())


#: Each instruction-set branch of the kernel's source, with the CPU flags needed to run it.
BRANCHES = {
    "generic vectors": (("-march=x86-64", "-U__SSE2__", "-U__SSE4_1__"), set()),
    "SSE2": (("-march=x86-64",), {"sse2"}),
    "SSE4.1": (("-march=x86-64-v2",), {"sse4_1"}),
    "AVX without FMA": (("-march=x86-64", "-mavx"), {"avx"}),
    "AVX2 + FMA": (("-march=x86-64-v3",), {"avx2", "fma"}),
    "AVX-512": (("-march=x86-64-v4",), {"avx512f", "avx512bw", "avx512vl", "avx512dq"}),
    "AVX-512 VNNI": (("-march=x86-64-v4", "-mavx512vnni"), {"avx512f", "avx512bw", "avx512vl", "avx512dq",
                                                            "avx512_vnni"}),
}


@needs_native
@pytest.mark.parametrize("branch", list(BRANCHES))
def test_every_instruction_set_branch_computes_the_product_and_keeps_rows_bitwise_independent(branch, tmp_path):
    import platform

    flags, needs = BRANCHES[branch]
    if platform.machine() not in ("x86_64", "AMD64") or not needs <= _cpu_flags():
        pytest.skip(f"this CPU cannot run the {branch} branch")
    lib = native._bind(native.compile_kernel(tmp_path / "k.so", native._compiler(), flags))
    assert native.self_check(lib) is None  # the int8vnni and int4avx2 products too, where the branch has them
    assert lib.selfspec_native_vnni() == ("VNNI" in branch)
    assert lib.selfspec_native_i4avx2() == (branch.startswith(("AVX2", "AVX-512")))  # checked above where built
    width, gen = lib.selfspec_native_tile(), torch.Generator().manual_seed(1)
    x, w = torch.randn(17, 70, generator=gen), torch.randn(2 * width + 3, 70, generator=gen)
    panels = native.to_panels(w, width)

    def product(rows: torch.Tensor) -> torch.Tensor:
        y = torch.empty(rows.shape[0], w.shape[0])
        lib.selfspec_native_linear(rows.data_ptr(), panels.data_ptr(), None, y.data_ptr(), rows.shape[0],
                                   w.shape[0], 70, 2)
        return y

    assert torch.equal(product(x), torch.cat([product(x[i : i + 1].contiguous()) for i in range(17)]))


@needs_native
def test_the_flags_variable_picks_the_target_and_is_part_of_the_build_key(monkeypatch, fresh_kernel):
    import platform

    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the flags below name x86-64 targets")
    assert native.native_unsupported() is None
    default_key = native.kernel_key()
    native._STATE.clear()
    monkeypatch.setenv(native.FLAGS_ENV, "-march=x86-64")  # the SSE branch: tiles of 8
    assert native.native_unsupported() is None
    assert native.kernel_key() != default_key and native.tile() == 8
    assert len(list(fresh_kernel.glob("kernels/native-*.so"))) == 2
    native._STATE.clear()
    monkeypatch.setenv(native.FLAGS_ENV, "-march=no-such-cpu")
    assert native.native_unsupported().startswith("compiling the native kernel with")


# ------------------------------------------------------------------------------ building copies
@needs_native
@settings(max_examples=25, deadline=None)
@given(out_f=st.integers(1, 70), in_f=st.integers(1, 300), group=st.sampled_from([7, 32, 128]),
       width=st.sampled_from([4, 8, 16, 32]), seed=st.integers(0, 2**16))
def test_the_kernels_building_helpers_write_bitwise_what_the_torch_definitions_write(out_f, in_f, group, width, seed):
    from selfspec._engine.draftweights.quantize import quantize_groups, quantize_groups_torch
    from selfspec._engine.runner.panels import from_panels_into, to_int4_quad_panels

    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(out_f, in_f, generator=gen) * torch.rand(out_f, 1, generator=gen) * 4
    w[0, : min(in_f, group)] = 0.25  # a constant group: its range is zero
    panels = native_copies.float_panels(w, width)
    assert torch.equal(panels, native.to_panels(w, width))
    rows = max(1, out_f - 1)
    assert torch.equal(native_copies.float_from_panels_into(panels, torch.empty(rows, in_f)),
                       from_panels_into(panels, torch.empty(rows, in_f)))
    assert torch.equal(native_copies.float_from_panels_into(panels, torch.empty(rows, in_f)), w[:rows])
    ours, torchs = quantize_groups(w, group), quantize_groups_torch(w, group)
    for a, b in zip(ours, torchs):
        assert a.dtype == b.dtype and torch.equal(a, b)
    fused = native_copies.quantize_int4_quad(w, group, 2 * width)
    if group % 4:  # a byte's four inputs would straddle groups: the two passes run instead
        assert fused is None
    else:
        for a, b in zip(fused, (to_int4_quad_panels(torchs[0], 2 * width), torchs[1], torchs[2])):
            assert torch.equal(a, b)


@needs_native
def test_a_native_linear_reports_its_weight_and_its_first_rows_without_the_whole_weight():
    from selfspec._engine.runner.layout import rebuilt_weight, weight_into, weight_rows, weight_spec

    lin = nn.Linear(70, 45, bias=False)
    nat = native_copies.NativeLinear(lin)
    assert rebuilt_weight(nat) and not rebuilt_weight(lin)
    assert weight_spec(nat) == (torch.Size((45, 70)), torch.float32, torch.device("cpu")) == weight_spec(lin)
    assert torch.equal(weight_rows(nat, 9), lin.weight.detach()[:9])
    assert torch.equal(weight_into(nat, torch.empty(45, 70)), lin.weight.detach())
    assert torch.equal(nat.weight, lin.weight.detach())


# ------------------------------------------------------------------------------ in the runner
@needs_native
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_a_native_runner_and_an_adopting_one_equal_the_model_up_to_rounding(arch):
    model = tiny_model(arch, dtype=torch.float32, tie_word_embeddings=False)
    ids = torch.tensor([[3, 5, 7, 11, 13, 17]])
    with torch.no_grad():
        before = model(ids).logits[0]
    runner = Runner(model, weight_layout="native")
    assert runner.weight_layout == "native" and runner.layer_layouts == ["native"] * runner.n_layers
    torch.testing.assert_close(runner.forward(ids[0]).logits, before, rtol=1e-4, atol=1e-4)
    Runner(model, weight_layout="native", adopt=True)
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert linears and all(isinstance(m, native_copies.NativeLinear) for m in linears)  # LM head included
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits[0], before, rtol=1e-4, atol=1e-4)


@needs_native
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_decoding_on_the_native_layout_is_lossless(arch):
    from selfspec import Decoder

    model = tiny_model(arch, dtype=torch.float32)
    prompt = [3, 4, 5, 6, 3, 4, 5, 6, 3, 4, 5, 7] * 2
    for plugin in ("vanilla", "lookup"):
        result = assert_lossless(model, Decoder(model, plugin, weight_layout="native"), prompt, 24)
        assert result.stats.weight_layout == "native"


@needs_native
def test_the_exact_mode_on_the_native_layout_equals_one_token_forwards_bitwise():
    torch.manual_seed(0)
    r = Runner(tiny_model("qwen2", dtype=torch.float32), weight_layout="native", exact=True)
    ids = torch.randint(0, r.vocab_size, (40,), generator=torch.Generator().manual_seed(1))
    cache = r.new_cache(41)
    r.forward(ids[:30], cache=cache, start=0, logits=None)
    one = torch.stack([r.forward(ids[30 + i : 31 + i], cache=cache, start=30 + i).logits[-1] for i in range(10)])
    cache = r.new_cache(41)
    r.forward(ids[:30], cache=cache, start=0, logits=None)
    assert torch.equal(one, r.forward(ids[30:], cache=cache, start=30).logits)
