"""The ``"native"`` weight layout and the ``"int8native"``/``"int4native"``/``"int8vnni"`` draft
weights: products by a kernel compiled for this CPU.

torch's float32 products for a handful of rows (one decoded token, a draft to verify) read the
weights well below the memory's speed on some CPUs: MKL's one-row product runs on one thread,
and oneDNN's prepacked kernel is tuned for wider blocks. ``native_kernel.c`` (beside this
module) is a small product kernel over weights cut into panels (:func:`to_panels`) that streams
each weight once per block of up to :func:`block_rows` rows. It is compiled at first use by
the machine's C compiler (``$CC``, else ``cc``, ``gcc`` or ``clang``) with ``-O3 -march=native``
(or the flags in ``SELFSPEC_NATIVE_FLAGS``) and OpenMP, kept in ``<cache dir>/kernels/`` under a
key of its source, compiler, flags and CPU, and checked against a float64 product before it is
used. :class:`NativeLinear` calls it; so do the ``int8native`` and ``int4native`` draft weights
(:mod:`selfspec._engine.draftweights.linears`: int8 panels with a float32 scale per output row,
or 4-bit panels with a scale and offset per row and group of inputs; float32 activations), and
the ``int8vnni`` draft weights where the compiler targets AVX-512 VNNI (:func:`vnni_unsupported`:
int8 panels of four inputs per lane, the activations rounded per row to 16-bit integers for
products of up to 2 rows and to 8-bit ones beyond, integer dot products).

Where it cannot run (no compiler, a failed build or self-check, not CPU float32,
``SELFSPEC_NATIVE=0``), :func:`native_unsupported` says why; ``auto`` then leaves it out of
the layouts it measures, and asking for ``"native"`` is a :class:`~.layout.WeightLayoutError`.

Exactness: each output is summed in input order with one fused multiply-add per weight,
whatever the block's width, the row's place in it or the thread count, so a row's result is
bitwise the same computed alone or in any block (the exact mode then needs no per-row
products). Against the model's own layout it differs by rounding, like ``"packed"``.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from torch import nn

from .panels import (  # noqa: F401 (the layouts the kernel reads, named here for its callers)
    CHUNK_ROWS,
    INT4_AVX2_FINE_ROWS,
    INT4_AVX2_TILE,
    VNNI_FINE_ROWS,
    VNNI_TILE,
    from_panels,
    int4avx2_error_bound,
    rounding_error_bound,
    to_group_panels,
    to_int4_panels,
    to_int4_quad_panels,
    to_int4_vnni_panels,
    to_panels,
    to_vnni_panels,
    vnni_error_bound,
)

#: Set to ``0`` to never build or use the native kernel.
ENV = "SELFSPEC_NATIVE"
#: The compiler flags that pick the kernel's target (default ``-march=native``), e.g.
#: ``-march=x86-64-v3`` to build and measure the AVX2 branch on an AVX-512 machine.
FLAGS_ENV = "SELFSPEC_NATIVE_FLAGS"
SOURCE = Path(__file__).with_name("native_kernel.c")
#: Seconds a build may take before it counts as failed.
BUILD_TIMEOUT = 180

_STATE: dict[str, object] = {}


# ------------------------------------------------------------------------------ the kernel
def native_unsupported(device_type: str = "cpu", dtype: torch.dtype = torch.float32) -> str | None:
    """Why the native kernel cannot run products of ``dtype`` on ``device_type``, or ``None``
    when it can. Builds the kernel (once per process; seconds, at first use on a machine) to
    find out."""
    if device_type != "cpu":
        return f"it runs on CPU only, not {device_type}"
    if dtype != torch.float32:
        return f"it computes in float32 only, not {str(dtype).removeprefix('torch.')}"
    if os.environ.get(ENV, "1").strip() in ("0", "false", "no"):
        return f"{ENV}=0"
    _load()
    why = _STATE.get("why")
    return str(why) if why else None


def kernel_key() -> str:
    """The built kernel's key (its source, compiler and CPU), for records of what it measured."""
    _library()
    return str(_STATE["key"])


def tile() -> int:
    """Output rows per panel of the compiled kernel's float32 products (one or two vectors,
    chosen per instruction set)."""
    return int(_library().selfspec_native_tile())


def tile_q() -> int:
    """Output rows per panel of the compiled kernel's int8 and 4-bit products (its vector width
    times two)."""
    return int(_library().selfspec_native_tile_q())


def block_rows() -> int:
    """Rows the kernel's float32 products compute per pass over a panel (at most)."""
    return int(_library().selfspec_native_rows())


def vnni_unsupported() -> str | None:
    """Why the ``int8vnni`` products cannot run here, or ``None`` when they can: the native
    kernel must build and its target must have AVX-512 VNNI (this CPU's, or the one
    ``SELFSPEC_NATIVE_FLAGS`` names)."""
    why = native_unsupported("cpu", torch.float32)
    if why:
        return why
    if not _library().selfspec_native_vnni():
        return "the native kernel's target has no AVX-512 VNNI (int8 dot products)"
    return None


def native_linear_i8vnni(x: torch.Tensor, panels: torch.Tensor, colsum: torch.Tensor, scale: torch.Tensor,
                         bias: torch.Tensor | None, out_features: int) -> torch.Tensor:
    """``x [n, in] @ (q * scale[:, None]).T + bias`` -> ``[n, out_features]`` float32, ``q`` as
    :func:`to_vnni_panels` laid it out, ``scale`` float32 ``[tiles * 32]``; each row of ``x``
    rounded to 16-bit integers (``n <=`` :data:`VNNI_FINE_ROWS`) or 8-bit ones (wider products) of a
    scale of its own.
    Only where :func:`vnni_unsupported` is ``None``."""
    n, in_features = x.shape
    y = torch.empty(n, out_features, dtype=torch.float32)
    xq, xs = _vnni_scratch(n, in_features)
    _library().selfspec_native_linear_i8vnni(
        x.data_ptr(), panels.data_ptr(), scale.data_ptr(), colsum.data_ptr(),
        None if bias is None else bias.data_ptr(), y.data_ptr(), xq.data_ptr(), xs.data_ptr(),
        n, out_features, in_features, torch.get_num_threads())
    return y


def native_linear_i4vnni(x: torch.Tensor, panels: torch.Tensor, gsum: torch.Tensor, gscale: torch.Tensor,
                         gzero: torch.Tensor, group: int, bias: torch.Tensor | None, out_features: int) -> torch.Tensor:
    """:func:`native_linear_int4`'s product (4-bit weights in groups of ``group`` inputs) by
    integer dot products: ``panels`` and ``gsum`` as :func:`to_int4_vnni_panels` laid them out,
    ``gscale``/``gzero`` as :func:`to_group_panels` laid them out at width 32; the activations
    rounded per row as :func:`native_linear_i8vnni` rounds them. Only where
    :func:`vnni_unsupported` is ``None``."""
    n, in_features = x.shape
    y = torch.empty(n, out_features, dtype=torch.float32)
    xq, xs = _vnni_scratch(n, in_features)
    xsum = torch.empty(n, gsum.shape[1], dtype=torch.float32)  # the kernel's scratch: x's sums per group
    _library().selfspec_native_linear_i4vnni(
        x.data_ptr(), panels.data_ptr(), gscale.data_ptr(), gzero.data_ptr(), gsum.data_ptr(), group,
        None if bias is None else bias.data_ptr(), y.data_ptr(), xq.data_ptr(), xs.data_ptr(), xsum.data_ptr(),
        n, out_features, in_features, torch.get_num_threads())
    return y


def int4avx2_unsupported() -> str | None:
    """Why the ``int4avx2`` products cannot run here, or ``None`` when they can: the native
    kernel must build and its target must have AVX2 and FMA (this CPU's, or the one
    ``SELFSPEC_NATIVE_FLAGS`` names)."""
    why = native_unsupported("cpu", torch.float32)
    if why:
        return why
    if not _library().selfspec_native_i4avx2():
        return "the native kernel's target has no AVX2 with FMA (8-bit integer products)"
    return None


def native_linear_i4avx2(x: torch.Tensor, panels: torch.Tensor, gscale: torch.Tensor, gzero: torch.Tensor,
                         group: int, bias: torch.Tensor | None, out_features: int) -> torch.Tensor:
    """:func:`native_linear_int4`'s product (4-bit weights in groups of ``group`` inputs) by
    8-bit integer products (AVX2 ``vpmaddubsw``): ``panels`` as :func:`to_int4_quad_panels`
    laid them out at width :data:`INT4_AVX2_TILE`, ``gscale``/``gzero`` as
    :func:`to_group_panels` laid them out at that width; each row of ``x`` rounded to 8-bit
    integers of a scale of its own, 15-bit for products of up to :data:`INT4_AVX2_FINE_ROWS` rows
    (two bytes) and 8-bit beyond (within :func:`int4avx2_error_bound`). Only where
    :func:`int4avx2_unsupported` is ``None``."""
    n, in_features = x.shape
    y = torch.empty(n, out_features, dtype=torch.float32)
    xq = torch.empty(n, 2 * -(-in_features // 4) * 4, dtype=torch.int8)  # the kernel's scratch: x rounded
    xs = torch.empty(n, dtype=torch.float32)
    xsum = torch.empty(n, gscale.shape[1], dtype=torch.float32)  # and x's sums per group
    _library().selfspec_native_linear_i4avx2(
        x.data_ptr(), panels.data_ptr(), gscale.data_ptr(), gzero.data_ptr(), group,
        None if bias is None else bias.data_ptr(), y.data_ptr(), xq.data_ptr(), xs.data_ptr(), xsum.data_ptr(),
        n, out_features, in_features, torch.get_num_threads())
    return y


def native_linear(x: torch.Tensor, panels: torch.Tensor, bias: torch.Tensor | None, out_features: int) -> torch.Tensor:
    """``x [n, in] @ W.T + bias`` -> ``[n, out_features]``, float32 on CPU, ``W`` as
    :func:`to_panels` laid it out. ``x`` must be contiguous."""
    n, in_features = x.shape
    y = torch.empty(n, out_features, dtype=torch.float32)
    _library().selfspec_native_linear(
        x.data_ptr(), panels.data_ptr(), None if bias is None else bias.data_ptr(), y.data_ptr(),
        n, out_features, in_features, torch.get_num_threads())
    return y


def native_linear_int8(x: torch.Tensor, panels: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None,
                       out_features: int) -> torch.Tensor:
    """:func:`native_linear` with ``W = q * scale[:, None]``: ``panels`` the int8 ``q`` as
    :func:`to_panels` laid it out, ``scale`` float32 ``[panels.shape[0] * width]``. The
    activations stay float32 (nothing is quantized but the weights)."""
    n, in_features = x.shape
    y = torch.empty(n, out_features, dtype=torch.float32)
    _library().selfspec_native_linear_int8(
        x.data_ptr(), panels.data_ptr(), scale.data_ptr(), None if bias is None else bias.data_ptr(), y.data_ptr(),
        n, out_features, in_features, torch.get_num_threads())
    return y


def native_linear_int4(x: torch.Tensor, panels: torch.Tensor, gscale: torch.Tensor, gzero: torch.Tensor,
                       group: int, bias: torch.Tensor | None, out_features: int) -> torch.Tensor:
    """:func:`native_linear` with 4-bit weights in groups of ``group`` inputs,
    ``W[o, i] = code[o, i] * gscale[o, i // group] + gzero[o, i // group]``: ``panels`` the codes
    as :func:`to_int4_panels` laid them out, ``gscale``/``gzero`` as :func:`to_group_panels` laid
    them out. The activations stay float32."""
    n, in_features = x.shape
    y = torch.empty(n, out_features, dtype=torch.float32)
    xsum = torch.empty(n, -(-in_features // group), dtype=torch.float32)  # the kernel's scratch
    _library().selfspec_native_linear_int4(
        x.data_ptr(), panels.data_ptr(), gscale.data_ptr(), gzero.data_ptr(), group,
        None if bias is None else bias.data_ptr(), y.data_ptr(), xsum.data_ptr(), n, out_features, in_features,
        torch.get_num_threads())
    return y


class NativeLinear(nn.Linear):
    """``nn.Linear`` computed by the native kernel on its own panel copy of the weight. Inputs
    ``[..., in]`` -> ``[..., out]``.

    Like :class:`~.layout.PackedLinear` it holds the panels only (a non-persistent buffer) and
    ``.weight`` rebuilds the ``[out, in]`` weight on demand (exactly; a temporary for code
    that reads a weight once). An input that is not float32 on CPU, or that needs a gradient,
    runs ``F.linear`` on that rebuilt weight instead: correct, not fast."""

    def __init__(self, linear: nn.Linear) -> None:
        nn.Module.__init__(self)  # not nn.Linear's: it would allocate a weight
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("panels", to_panels(linear.weight, tile()), persistent=False)
        self.bias = linear.bias

    @property
    def weight(self) -> torch.Tensor:  # type: ignore[override]
        """The ``[out, in]`` weight, rebuilt from the panels (a new tensor on every access)."""
        return from_panels(self.panels, self.out_features)

    def nbytes(self) -> int:
        """Bytes of weights a product reads (the padding rows excluded)."""
        return self.in_features * self.out_features * 4

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32 or x.device.type != "cpu" or (x.requires_grad and torch.is_grad_enabled()):
            bias = None if self.bias is None else self.bias.to(x.dtype)
            return nn.functional.linear(x, self.weight.to(x.dtype), bias)
        bias = self.bias
        if bias is not None and (bias.dtype != torch.float32 or not bias.is_contiguous()):
            bias = bias.float().contiguous()
        y = native_linear(x.reshape(-1, self.in_features).contiguous(), self.panels, bias, self.out_features)
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, native panels"


# ------------------------------------------------------------------------------ helpers
def _vnni_scratch(rows: int, in_features: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The VNNI products' scratch: the rows' activation bytes (two per input, padded to 4 inputs)
    and their scales."""
    return (torch.empty(rows, 2 * -(-in_features // 4) * 4, dtype=torch.uint8),
            torch.empty(rows, dtype=torch.float32))


def _library() -> ctypes.CDLL:
    lib = _load()
    if lib is None:
        raise RuntimeError(f"the native kernel cannot run here: {_STATE.get('why')}")
    return lib


def _load() -> ctypes.CDLL | None:
    """The compiled kernel (built or read from the cache), or ``None`` with ``_STATE["why"]``."""
    if "lib" in _STATE:
        return _STATE["lib"]  # type: ignore[return-value]
    lib, why = None, None
    try:
        lib = _bind(_build())
        why = _self_check(lib)
    except (OSError, RuntimeError, subprocess.SubprocessError) as err:
        why = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    if why:
        lib = None
    _STATE.update(lib=lib, why=why)
    return lib


def _compiler() -> str:
    for name in [os.environ.get("CC", ""), "cc", "gcc", "clang"]:
        found = shutil.which(name) if name else None
        if found:
            return found
    raise RuntimeError("no C compiler found (set CC, or install gcc or clang)")


def _build() -> Path:
    """The kernel's shared library in the cache, compiled first if it is not there."""
    from selfspec._engine.machine import cpu_capability, cpu_model
    from selfspec._engine.paths import cache_dir

    cc = _compiler()
    flags = tuple(os.environ.get(FLAGS_ENV, "").split()) or ("-march=native",)
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    source = SOURCE.read_bytes()
    key = hashlib.sha256(b"\0".join([source, cc.encode(), version.encode(), cpu_model().encode(),
                                     cpu_capability().label.encode(), " ".join(flags).encode()])).hexdigest()[:16]
    target = cache_dir() / "kernels" / f"native-{key}.so"
    _STATE["key"] = key
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    print("selfspec: compiling the native float32 kernel for this CPU (once per machine)...",
          file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        os.replace(compile_kernel(Path(tmp) / target.name, cc, flags), target)
    return target


def compile_kernel(out: Path, cc: str, flags: tuple[str, ...] = ("-march=native",), source: Path = SOURCE) -> Path:
    """Compile ``source`` (``native_kernel.c``, or a version of it to compare) into the shared
    library ``out`` with OpenMP (else without: one thread); ``flags`` pick the target (tests
    build every instruction-set branch)."""
    base = [cc, "-O3", *flags, "-std=gnu11", "-shared", "-fPIC", str(source)]
    errors = ""
    for extra in (["-fopenmp"], []):
        done = subprocess.run([*base, *extra, "-o", str(out)], capture_output=True, text=True,
                              timeout=BUILD_TIMEOUT)
        if done.returncode == 0:
            return out
        errors = done.stderr.strip()
    first = next((line.strip() for line in errors.splitlines() if "error" in line.lower()), "")
    raise RuntimeError(f"compiling the native kernel with {cc} failed: {first[:300] or errors[-300:]}")


def _bind(path: Path) -> ctypes.CDLL:
    """The compiled library at ``path`` with its products' argument types declared."""
    lib = ctypes.CDLL(str(path))
    lib.selfspec_native_linear.restype = None
    lib.selfspec_native_linear.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int] * 4
    lib.selfspec_native_linear_int8.restype = None
    lib.selfspec_native_linear_int8.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int] * 4
    lib.selfspec_native_linear_int4.restype = None
    lib.selfspec_native_linear_int4.argtypes = ([ctypes.c_void_p] * 4 + [ctypes.c_int] + [ctypes.c_void_p] * 3
                                                + [ctypes.c_int] * 4)
    lib.selfspec_native_vnni.restype = ctypes.c_int
    lib.selfspec_native_linear_i8vnni.restype = None
    lib.selfspec_native_linear_i8vnni.argtypes = [ctypes.c_void_p] * 8 + [ctypes.c_int] * 4
    lib.selfspec_native_linear_i4vnni.restype = None
    lib.selfspec_native_linear_i4vnni.argtypes = ([ctypes.c_void_p] * 5 + [ctypes.c_int] + [ctypes.c_void_p] * 5
                                                  + [ctypes.c_int] * 4)
    lib.selfspec_native_i4avx2.restype = ctypes.c_int
    lib.selfspec_native_linear_i4avx2.restype = None
    lib.selfspec_native_linear_i4avx2.argtypes = ([ctypes.c_void_p] * 4 + [ctypes.c_int] + [ctypes.c_void_p] * 5
                                                  + [ctypes.c_int] * 4)
    return lib


def _self_check(lib: ctypes.CDLL) -> str | None:
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
            xq, xs = _vnni_scratch(rows, in_f)
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
    xq, xs = torch.empty(rows, 2 * -(-in_f // 4) * 4, dtype=torch.int8), torch.empty(rows)
    xsum = torch.empty(rows, gs.shape[1])
    lib.selfspec_native_linear_i4avx2(x.data_ptr(), panels.data_ptr(), gsp.data_ptr(), gzp.data_ptr(), group,
                                      b.data_ptr(), y.data_ptr(), xq.data_ptr(), xs.data_ptr(), xsum.data_ptr(),
                                      rows, out_f, in_f, 2)
    coded = codes.double() * gs.double().repeat_interleave(group, 1)[:, :in_f]
    err = (y.double() - (x.double() @ w4.T + b.double())).abs()
    if not (err <= int4avx2_error_bound(x, coded) + 1e-4 * (1 + x.double().abs() @ w4.abs().T)).all():
        return f"the compiled int4 AVX2 kernel's self-check failed (error {err.max():.3g})"
    return None
