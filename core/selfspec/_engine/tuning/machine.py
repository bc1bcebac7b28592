"""What this machine's CPU is and can do: the model name, physical cores, the instruction-set
level ATen dispatches to, and which low-precision kernels oneDNN can run here.

One home for facts that the runner (which weight layout ``auto`` picks), the CLI (default
thread count) and the benchmarks (what every result records) need. Everything is read at
call time and cached per process; nothing here imports torch at module import.

The *effective* capability is what counts, not the silicon: ``ATEN_CPU_CAPABILITY=avx2``
lowers ATen's dispatch and ``ONEDNN_MAX_CPU_ISA=AVX2`` lowers oneDNN's, so an AVX-512 machine
run with both behaves, and is reported, as an AVX2 one (:func:`forced_isa` says which of the
two variables were set).
"""

from __future__ import annotations

import datetime as dt
import functools
import os
import platform
import sys
from dataclasses import asdict, dataclass
from typing import Any

from selfspec._engine.tuning.version import __version__

#: Environment variables that lower the instruction set torch's kernels use.
ISA_ENV_VARS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")


@dataclass(frozen=True)
class CpuCapability:
    """What the CPU can run, as torch and oneDNN see it in this process.

    ``aten``: ATen's dispatch level (``torch.backends.cpu.get_cpu_capability()``: ``"AVX2"``,
    ``"AVX512"``, ``"DEFAULT"``, ...). ``avx512``/``avx512_bf16``/``amx``: hardware features
    (cpuinfo). ``onednn``: oneDNN is built in. ``onednn_bf16``/``onednn_fp16``: oneDNN's
    inner-product kernels for bf16/fp16 run here (AVX-512 BW/VL/DQ or AVX-NE-CONVERT for
    bf16; AVX-512 FP16 or AVX-NE-CONVERT for fp16), after ``ONEDNN_MAX_CPU_ISA``.
    """

    aten: str
    avx512: bool = False
    avx512_bf16: bool = False
    amx: bool = False
    onednn: bool = True
    onednn_bf16: bool = False
    onednn_fp16: bool = False

    @property
    def label(self) -> str:
        """``"AVX2"``, ``"AVX-512"``, ``"AVX-512 + AMX"``... : the effective level, for tables."""
        level = {"AVX512": "AVX-512", "AVX2": "AVX2", "DEFAULT": "no AVX2"}.get(
            self.aten, self.aten
        )
        if self.aten == "AVX512" and self.amx:
            level += " + AMX"
        elif self.aten == "AVX512" and self.avx512_bf16:
            level += " (BF16)"
        return level

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "label": self.label}


@functools.lru_cache(maxsize=1)
def cpu_capability() -> CpuCapability:
    """This process's :class:`CpuCapability` (cached: the environment variables that change it
    are read once, when torch loads)."""
    import torch  # here: the CLI sets torch's environment (threads, wait policy) before it loads

    def probe(name: str) -> bool:
        fn = getattr(torch.cpu, name, None)
        try:
            return bool(fn()) if fn is not None else False
        except Exception:  # pragma: no cover - a torch build without the probe
            return False

    onednn = bool(torch.backends.mkldnn.is_available())

    def onednn_probe(name: str) -> bool:
        fn = getattr(torch.ops.mkldnn, name, None) if onednn else None
        try:
            return bool(fn()) if fn is not None else False
        except Exception:  # pragma: no cover
            return False

    return CpuCapability(
        aten=str(torch.backends.cpu.get_cpu_capability()),
        avx512=probe("_is_avx512_supported"),
        avx512_bf16=probe("_is_avx512_bf16_supported"),
        amx=probe("_is_amx_tile_supported"),
        onednn=onednn,
        onednn_bf16=onednn_probe("_is_mkldnn_bf16_supported"),
        onednn_fp16=onednn_probe("_is_mkldnn_fp16_supported"),
    )


def forced_isa() -> dict[str, str]:
    """The :data:`ISA_ENV_VARS` set in this process's environment, with their values."""
    return {k: os.environ[k] for k in ISA_ENV_VARS if os.environ.get(k)}


@functools.lru_cache(maxsize=1)
def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), or what :mod:`platform` knows."""
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return name


def physical_cores() -> int:
    """Physical CPU cores available to this process (hyper-threads do not help matmuls)."""
    try:
        available = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        available = os.cpu_count() or 1
    cores: set[tuple[str, str]] = set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            phys = core = ""
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "physical id":
                    phys = value.strip()
                elif key == "core id":
                    core = value.strip()
                elif not line.strip() and core:
                    cores.add((phys, core))
                    phys = core = ""
            if core:
                cores.add((phys, core))
    except OSError:
        pass
    return max(1, min(len(cores) or available, available))


def plural(n: Any, word: str) -> str:
    """``"1 thread"``, ``"2 threads"``; a count that is not a number (``"?"``) takes the plural."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def default_threads() -> int:
    """Torch threads the CLI uses when none are asked for: the physical cores, at most
    torch's own default."""
    import torch  # here: the CLI sets torch's environment before it loads

    return max(1, min(physical_cores(), torch.get_num_threads()))


#: Whether ``OMP_WAIT_POLICY=PASSIVE`` was in the environment before torch (and its OpenMP
#: runtime, which reads the variable once) was loaded; set by :func:`prefer_passive_wait`.
_passive_before_torch = False


@dataclass(frozen=True)
class ThreadChoice:
    """How many torch threads a run uses, and why. ``reason``: ``"asked"`` (``--threads``),
    ``"default"`` (the physical cores, at most torch's default) or ``"busy"``: the 1-minute
    load average at the start was at least the physical core count. OpenMP threads spinning
    at barriers on shared cores then slow a decode about 10× (docs/performance.md, "A busy
    machine"), so a busy run keeps its threads with ``OMP_WAIT_POLICY=PASSIVE`` when that was
    set before torch loaded (what the CLI does, :func:`prefer_passive_wait`), else runs on one
    thread. ``wait_policy`` is the ``OMP_WAIT_POLICY`` in effect (``None``: OpenMP's default)."""

    threads: int
    reason: str
    load_average: float | None
    physical_cores: int
    wait_policy: str | None = None

    def note(self) -> str:
        """The one line the CLI prints on stderr when it chose for a busy machine."""
        how = (
            f"{plural(self.threads, 'thread')} with OMP_WAIT_POLICY=PASSIVE"
            if self.wait_policy == "PASSIVE"
            else plural(self.threads, "thread")
        )
        return (
            f"specdec: the machine is busy (load average {self.load_average:.1f} "
            f"on {self.physical_cores} cores): running on {how} (--threads N to override)"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "threads": self.threads,
            "threads_reason": self.reason,
            "omp_wait_policy": self.wait_policy,
            "load_average_start": self.load_average,
        }


def load_average() -> float | None:
    """The 1-minute load average, or None where the OS does not say."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):  # pragma: no cover - not on Unix
        return None


def is_busy(load: float | None, cores: int) -> bool:
    """A load average of at least the physical core count (on more than one core)."""
    return load is not None and cores > 1 and load >= cores


def prefer_passive_wait(load: float | None = None) -> bool:
    """On a busy machine (:func:`is_busy`), set ``OMP_WAIT_POLICY=PASSIVE`` in the environment
    unless the user set the variable or torch is already loaded (it would come too late).
    Call it first thing in a process (the CLI does). Returns whether PASSIVE is now in effect."""
    global _passive_before_torch
    if "torch" in sys.modules:
        return _passive_before_torch
    if not os.environ.get("OMP_WAIT_POLICY") and is_busy(
        load_average() if load is None else load, physical_cores()
    ):
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    _passive_before_torch = os.environ.get("OMP_WAIT_POLICY", "").upper() == "PASSIVE"
    return _passive_before_torch


def choose_threads(requested: int | None = None, load: float | None = None) -> ThreadChoice:
    """The :class:`ThreadChoice` of a run: ``requested`` when given; else, on a busy machine
    (``load``, default: the load average now), the physical cores when ``OMP_WAIT_POLICY=PASSIVE``
    was set before torch loaded, one thread when it was not; else :func:`default_threads`."""
    cores = physical_cores()
    load = load_average() if load is None else load
    policy = "PASSIVE" if _passive_before_torch else None
    if requested:
        return ThreadChoice(requested, "asked", load, cores, policy)
    if is_busy(load, cores):
        return ThreadChoice(default_threads() if policy else 1, "busy", load, cores, policy)
    return ThreadChoice(default_threads(), "default", load, cores, policy)


def capability_note(machine: dict[str, Any]) -> str:
    """`` [AVX2]`` or `` [AVX2, forced by ONEDNN_MAX_CPU_ISA=AVX2]``...: the effective ISA a
    :func:`machine_info` record holds, for tables and plot titles (empty for records from
    before it was recorded)."""
    label = machine.get("cpu_capability")
    if not label:
        return ""
    how = ", ".join(f"{k}={v}" for k, v in (machine.get("forced_isa") or {}).items())
    return f" [{label}, forced by {how}]" if how else f" [{label}]"


def machine_info() -> dict[str, Any]:
    """What a measurement must record: CPU model and capability, cores, threads, library
    versions, the forced ISA variables, and the date (UTC)."""
    import torch  # here: the CLI sets torch's environment before it loads
    import transformers  # here: only a measurement's record needs it

    cap = cpu_capability()
    info: dict[str, Any] = {
        "cpu": cpu_model(),
        "cpu_capability": cap.label,
        "cpu_features": cap.as_dict(),
        "cores": os.cpu_count(),
        "physical_cores": physical_cores(),
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }
    if forced_isa():
        info["forced_isa"] = forced_isa()
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    info["selfspec"] = __version__
    return info


def available_memory() -> int | None:
    """Bytes of memory available for new allocations (Linux ``MemAvailable``), else ``None``."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
