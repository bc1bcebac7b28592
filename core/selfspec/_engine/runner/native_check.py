"""The native kernel's self-check: each of its products against a float64 product of the same
weights, run once when the kernel is loaded (:func:`selfspec._engine.runner.native.native_unsupported`
reports a failure as the reason it cannot run)."""

from __future__ import annotations

import ctypes

import torch

from .panels import (
    INT4_AVX2_FINE_ROWS,
    INT4_AVX2_TILE,
    VNNI_FINE_ROWS,
    VNNI_TILE,
    int4avx2_error_bound,
    rounded_scratch,
    to_group_panels,
    to_int4_panels,
    to_int4_quad_panels,
    to_int4_vnni_panels,
    to_panels,
    to_vnni_panels,
    vnni_error_bound,
)


def self_check(lib: ctypes.CDLL) -> str | None:
    """Why the kernel's products disagree with a float64 product, or ``None``."""
    gen = torch.Generator().manual_seed(0)
    width = int(lib.selfspec_native_tile())
    for rows, out_f, in_f in ((1, 3 * width + 5, 77), (lib.selfspec_native_rows() + 3, width, 130)):
        x = torch.randn(rows, in_f, generator=gen)
        w = torch.randn(out_f, in_f, generator=gen)
        b = torch.randn(out_f, generator=gen)
        y = torch.empty(rows, out_f)
        panels = to_panels(w, width)  # held: the kernel reads it through a raw pointer
        lib.selfspec_native_linear(x.data_ptr(), panels.data_ptr(), b.data_ptr(), y.data_ptr(), rows, out_f, in_f, 2)
        ref = x.double() @ w.double().T + b.double()
        if not torch.allclose(y.double(), ref, rtol=1e-4, atol=1e-4):
            return f"the compiled kernel's self-check failed (error {(y.double() - ref).abs().max():.3g})"
        q = torch.randint(-127, 128, (out_f, in_f), generator=gen, dtype=torch.int8)
        wq = int(lib.selfspec_native_tile_q())
        scale = torch.rand(-(-out_f // wq) * wq, generator=gen)
        qpanels = to_panels(q, wq, torch.int8)
        lib.selfspec_native_linear_int8(x.data_ptr(), qpanels.data_ptr(), scale.data_ptr(), b.data_ptr(),
                                        y.data_ptr(), rows, out_f, in_f, 2)
        ref = (x.double() @ q.double().T) * scale[:out_f].double() + b.double()
        if not torch.allclose(y.double(), ref, rtol=1e-4, atol=1e-4 * 127):
            return f"the compiled int8 kernel's self-check failed (error {(y.double() - ref).abs().max():.3g})"
        group = 32
        codes = torch.randint(0, 16, (out_f, in_f), generator=gen, dtype=torch.uint8)
        gs = torch.rand(out_f, -(-in_f // group), generator=gen)
        gz = torch.randn(out_f, -(-in_f // group), generator=gen)
        q4, gsp, gzp = to_int4_panels(codes, wq), to_group_panels(gs, wq), to_group_panels(gz, wq)
        xsum = torch.empty(rows, gs.shape[1])
        lib.selfspec_native_linear_int4(x.data_ptr(), q4.data_ptr(), gsp.data_ptr(), gzp.data_ptr(), group,
                                        b.data_ptr(), y.data_ptr(), xsum.data_ptr(), rows, out_f, in_f, 2)
        w4 = codes.double() * gs.double().repeat_interleave(group, 1)[:, :in_f] \
            + gz.double().repeat_interleave(group, 1)[:, :in_f]
        ref = x.double() @ w4.T + b.double()
        if not torch.allclose(y.double(), ref, rtol=1e-4, atol=1e-4 * 15):
            return f"the compiled int4 kernel's self-check failed (error {(y.double() - ref).abs().max():.3g})"
        if lib.selfspec_native_i4avx2():
            why = _self_check_i4avx2(lib, x, b, codes, gs, gz, group, w4)
            if why:
                return why
        if lib.selfspec_native_vnni():
            if (lib.selfspec_native_vnni_tile(), lib.selfspec_native_vnni_fine()) != (VNNI_TILE, VNNI_FINE_ROWS):
                return "the compiled int8 VNNI kernel's panel width or 16-bit rows differ from panels.py's"
            vp, colsum = to_vnni_panels(q)
            vscale = torch.rand(vp.shape[0] * VNNI_TILE, generator=gen)
            xq, xs = rounded_scratch(rows, in_f)
            lib.selfspec_native_linear_i8vnni(x.data_ptr(), vp.data_ptr(), vscale.data_ptr(), colsum.data_ptr(),
                                              b.data_ptr(), y.data_ptr(), xq.data_ptr(), xs.data_ptr(),
                                              rows, out_f, in_f, 2)
            wq = q.double() * vscale[:out_f].double()[:, None]
            err = (y.double() - (x.double() @ wq.T + b.double())).abs()
            if not (err <= vnni_error_bound(x, wq) + 1e-4).all():
                return f"the compiled int8 VNNI kernel's self-check failed (error {err.max():.3g})"
            p4, gsum4 = to_int4_vnni_panels(codes, group)
            gs4, gz4 = to_group_panels(gs, VNNI_TILE), to_group_panels(gz, VNNI_TILE)
            xsum = torch.empty(rows, gs.shape[1])
            lib.selfspec_native_linear_i4vnni(x.data_ptr(), p4.data_ptr(), gs4.data_ptr(), gz4.data_ptr(),
                                              gsum4.data_ptr(), group, b.data_ptr(), y.data_ptr(), xq.data_ptr(),
                                              xs.data_ptr(), xsum.data_ptr(), rows, out_f, in_f, 2)
            coded = codes.double() * gs.double().repeat_interleave(group, 1)[:, :in_f]
            err = (y.double() - (x.double() @ w4.T + b.double())).abs()
            if not (err <= vnni_error_bound(x, coded) + 1e-4 * (1 + x.double().abs() @ w4.abs().T)).all():
                return f"the compiled int4 VNNI kernel's self-check failed (error {err.max():.3g})"
    return None


def _self_check_i4avx2(lib: ctypes.CDLL, x: torch.Tensor, b: torch.Tensor, codes: torch.Tensor, gs: torch.Tensor,
                       gz: torch.Tensor, group: int, w4: torch.Tensor) -> str | None:
    """Why the ``int4avx2`` products of ``x`` by the 4-bit weights ``w4`` (``codes * gs + gz``
    per group) miss ``x @ w4.T + b`` by more than their rounding bound, or ``None``."""
    if (lib.selfspec_native_i4avx2_tile(), lib.selfspec_native_i4avx2_fine()) != (INT4_AVX2_TILE, INT4_AVX2_FINE_ROWS):
        return "the compiled int4 AVX2 kernel's panel width or 15-bit rows differ from panels.py's"
    rows, in_f = x.shape
    out_f = codes.shape[0]
    panels = to_int4_quad_panels(codes, INT4_AVX2_TILE)
    gsp, gzp = to_group_panels(gs, INT4_AVX2_TILE), to_group_panels(gz, INT4_AVX2_TILE)
    y = torch.empty(rows, out_f)
    xq, xs = rounded_scratch(rows, in_f)
    xsum = torch.empty(rows, gs.shape[1])
    lib.selfspec_native_linear_i4avx2(x.data_ptr(), panels.data_ptr(), gsp.data_ptr(), gzp.data_ptr(), group,
                                      b.data_ptr(), y.data_ptr(), xq.data_ptr(), xs.data_ptr(), xsum.data_ptr(),
                                      rows, out_f, in_f, 2)
    coded = codes.double() * gs.double().repeat_interleave(group, 1)[:, :in_f]
    err = (y.double() - (x.double() @ w4.T + b.double())).abs()
    if not (err <= int4avx2_error_bound(x, coded) + 1e-4 * (1 + x.double().abs() @ w4.abs().T)).all():
        return f"the compiled int4 AVX2 kernel's self-check failed (error {err.max():.3g})"
    return None
