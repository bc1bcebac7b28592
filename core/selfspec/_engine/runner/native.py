"""The ``"native"`` weight layout and the ``"int8native"``/``"int4native"``/``"int8vnni"``/
``"int4avx2"`` draft weights: products by a kernel compiled for this CPU.

torch's float32 products for a handful of rows (one decoded token, a draft to verify) read the
weights well below the memory's speed on some CPUs: MKL's one-row product runs on one thread,
and oneDNN's prepacked kernel is tuned for wider blocks. ``native_kernel.c`` (beside this
module) is a small product kernel over weights cut into panels (:func:`to_panels`) that streams
each weight once per block of up to :func:`block_rows` rows. It is compiled at first use by
the machine's C compiler (``$CC``, else ``cc``, ``gcc`` or ``clang``) with ``-O3 -march=native``
(or the flags in ``SELFSPEC_NATIVE_FLAGS``) and OpenMP, kept in ``<cache dir>/kernels/`` under a
key of its source, compiler, flags and CPU, and checked against a float64 product before it is
used. :class:`~.native_copies.NativeLinear` calls it; so do the ``int8native`` and ``int4native`` draft weights
(:mod:`selfspec._engine.draftweights.linears`: int8 panels with a float32 scale per output row,
or 4-bit panels with a scale and offset per row and group of inputs; float32 activations), and
the ``int8vnni`` draft weights where the compiler targets AVX-512 VNNI (:func:`vnni_unsupported`:
int8 panels of four inputs per lane, the activations rounded per row to 16-bit integers for
products of up to 2 rows and to 8-bit ones beyond, integer dot products), and the ``int4avx2``
draft weights where it targets AVX2 (:func:`int4avx2_unsupported`: 4-bit panels of four
inputs per lane, the activations rounded per row to 15-bit integers for products of up to 2
rows and to 8-bit ones beyond, 8-bit integer products).

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

from .native_check import self_check
from .panels import (  # noqa: F401 (the layouts the kernel reads, named here for its callers)
    CHUNK_ROWS,
    INT4_AVX2_FINE_ROWS,
    INT4_AVX2_TILE,
    VNNI_FINE_ROWS,
    VNNI_TILE,
    from_panels,
    int4avx2_error_bound,
    rounded_scratch,
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
    return _target_lacks("selfspec_native_vnni", "AVX-512 VNNI (int8 dot products)")


def native_linear_i8vnni(x: torch.Tensor, panels: torch.Tensor, colsum: torch.Tensor, scale: torch.Tensor,
                         bias: torch.Tensor | None, out_features: int) -> torch.Tensor:
    """``x [n, in] @ (q * scale[:, None]).T + bias`` -> ``[n, out_features]`` float32, ``q`` as
    :func:`to_vnni_panels` laid it out, ``scale`` float32 ``[tiles * 32]``; each row of ``x``
    rounded to 16-bit integers (``n <=`` :data:`VNNI_FINE_ROWS`) or 8-bit ones (wider products) of a
    scale of its own.
    Only where :func:`vnni_unsupported` is ``None``."""
    n, in_features = x.shape
    y = torch.empty(n, out_features, dtype=torch.float32)
    xq, xs = rounded_scratch(n, in_features)
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
    xq, xs = rounded_scratch(n, in_features)
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
    return _target_lacks("selfspec_native_i4avx2", "AVX2 with FMA (8-bit integer products)")


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
    xq, xs = rounded_scratch(n, in_features)
    xsum = torch.empty(n, gscale.shape[1], dtype=torch.float32)  # the kernel's scratch: x's sums per group
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


# ------------------------------------------------------------------------------ helpers
def _target_lacks(flag: str, feature: str) -> str | None:
    """Why products the kernel compiles only for some targets cannot run here (the kernel does not
    build, or ``flag()`` says its target lacks ``feature``), or ``None``."""
    why = native_unsupported("cpu", torch.float32)
    if why:
        return why
    if not getattr(_library(), flag)():
        return f"the native kernel's target has no {feature}"
    return None


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
        why = self_check(lib)
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
    for name in ("selfspec_native_to_panels", "selfspec_native_from_panels"):
        getattr(lib, name).restype = None
        getattr(lib, name).argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int] * 4
    lib.selfspec_native_quantize_int4_quad.restype = ctypes.c_int
    lib.selfspec_native_quantize_int4_quad.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int] * 5
    lib.selfspec_native_quantize_groups.restype = None
    lib.selfspec_native_quantize_groups.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int] * 4
    lib.selfspec_native_linear_i4avx2.restype = None
    lib.selfspec_native_linear_i4avx2.argtypes = ([ctypes.c_void_p] * 4 + [ctypes.c_int] + [ctypes.c_void_p] * 5
                                                  + [ctypes.c_int] * 4)
    return lib
