"""``gym-llm export RUN --out DIR [--merge]``: a training run's model, on its own, for other tools.

RUN is a run folder of ``gym-llm train`` (its newest checkpoint) or one of its checkpoint folders
(``RUN/checkpoints/step-N``). The trainer's state (optimizer, RNG, counters) stays behind.

* A LoRA run (``--lora-rank``): ``--merge`` writes the base model with the adapter merged into its weights
  (``W + (alpha / r) B A`` in every adapted layer), its config and tokenizer: a plain model folder that transformers
  and vLLM load without PEFT (``--model DIR`` for ``gym-llm eval``). Without ``--merge`` it writes the adapter in
  PEFT's format (``adapter_model.safetensors``, ``adapter_config.json``), the tokenizer and ``base_model.json``, a
  note of the base model it applies to: load it with ``peft.PeftModel.from_pretrained(base, DIR)`` or serve it with
  vLLM (``--enable-lora``, ``LoRARequest``).
* A full fine-tune: the checkpoint's model folder (weights, config, tokenizer); there is nothing to merge.

    gym-llm export runs/lora --merge --out runs/lora-merged
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
from pathlib import Path

from gym_llm_adapters.cli.errors import UsageError

__all__ = ["register", "run", "export"]

logger = logging.getLogger(__name__)

_TRAINER_FILES = frozenset({"trainer_state.json", "optimizer.pt", "rng.pt"})


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("export", help="write a run's model (a LoRA run's adapter, or merged) to a folder",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", metavar="RUN", type=Path,
                        help="a `gym-llm train` run folder (its newest checkpoint) or a checkpoint folder in it")
    parser.add_argument("--out", type=Path, required=True, help="the folder to write (new or empty)")
    parser.add_argument("--merge", action="store_true",
                        help="LoRA runs: merge the adapter into the base weights and write a plain model (default: "
                             "the adapter alone, with a note of its base)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                        help="--merge: the merged weights' dtype (default: float32, as the checkpoints hold them)")
    parser.add_argument("--base", metavar="M", default=None,
                        help="LoRA runs: the base model's folder, when the one the run recorded has moved")
    parser.set_defaults(func=run)


def _checkpoint(run_dir: Path) -> Path:
    from gym_llm_adapters.training.checkpoint import latest_checkpoint

    if not run_dir.is_dir():
        raise UsageError(f"{run_dir}: no such folder; give a `gym-llm train` run folder (its --out) or a checkpoint "
                         "folder in it (RUN/checkpoints/step-N)")
    if (run_dir / "trainer_state.json").is_file():
        return run_dir
    found = latest_checkpoint(run_dir)
    if found is None:
        raise UsageError(f"{run_dir} holds no checkpoint of a `gym-llm train` run (no checkpoints/*/trainer_state.json);"
                         " give the run's --out folder or one of its checkpoints/step-N")
    return found


def _check_out(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"--out {out} exists and is not an empty folder; choose a new folder (nothing is overwritten)")


def export(run_dir: str | Path, out: str | Path, *, merge: bool = False, dtype: str = "float32",
           base: str | None = None) -> Path:
    """Write the model of ``run_dir`` (a run folder or a checkpoint folder) to ``out`` (module docstring); returns
    ``out``. ``UsageError`` for a folder that is not a run or an ``out`` that is not new or empty."""
    from gym_llm_adapters.training import lora_run

    checkpoint, out = _checkpoint(Path(run_dir)), Path(out)
    _check_out(out)
    if lora_run.is_lora_checkpoint(checkpoint):
        base_path = base if base is not None else _recorded_base(checkpoint)
        if merge:
            out.mkdir(parents=True, exist_ok=True)
            return lora_run.merge_checkpoint(checkpoint, out, base=base_path, dtype=dtype)
        _copy_model_files(checkpoint, out)
        note = {"base_model": base_path, "adapter": "PEFT LoRA (adapter_model.safetensors, adapter_config.json)",
                "load": f"peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained({base_path!r}), "
                        f"{str(out)!r})", "from_checkpoint": str(checkpoint)}
        state = json.loads((checkpoint / "trainer_state.json").read_text(encoding="utf-8"))
        if state.get("lora"):
            note["base_model_spec"] = state["lora"]["base_model"]
        (out / "base_model.json").write_text(json.dumps(note, indent=1), encoding="utf-8")
        return out
    if merge:
        logger.info("%s is a full fine-tune's checkpoint: nothing to merge, writing its model as it is", checkpoint)
    _copy_model_files(checkpoint, out)
    return out


def _recorded_base(checkpoint: Path) -> str:
    from gym_llm_adapters.training import lora_run

    try:
        base = lora_run.base_of(checkpoint)
    except (ValueError, OSError) as e:
        raise UsageError(f"{checkpoint}: {e}") from e
    if not (Path(base) / "config.json").is_file():
        raise UsageError(f"{checkpoint}: its base model {base} is not a model folder here (moved?); pass its folder: "
                         "--base MODEL_DIR")
    return base


def _copy_model_files(checkpoint: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for file in sorted(checkpoint.iterdir()):
        if file.is_file() and file.name not in _TRAINER_FILES:
            shutil.copy2(file, out / file.name)


def run(args: argparse.Namespace) -> int:
    out = export(args.run, args.out, merge=args.merge, dtype=args.dtype, base=args.base)
    what = "merged model" if args.merge and (out / "config.json").is_file() else \
        "adapter" if (out / "base_model.json").is_file() else "model"
    print(f"wrote the {what} to {out}")
    return 0
