"""The step of each algorithm, as a part of :class:`~gym_llm_adapters.training.trainer.Trainer`: one SFT step, one GRPO
step (rollout, advantages, reference KL, the loss over micro-batches and ``num_iterations`` passes, the optimizer,
the push, the metrics), the micro-batching and log-prob helpers, and the data-parallel sums they need. The trainer's
module docstring says what a step does; this module is how.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import numpy as np

from gym_llm_adapters.training.precision import autocast
from gym_llm_adapters.training.step_time import PhaseClock

__all__ = ["StepsMixin"]

logger = logging.getLogger(__name__)


class StepsMixin:
    """The steps of :class:`~gym_llm_adapters.training.trainer.Trainer` (which holds the state they read and write:
    ``config``, ``policy``, ``optimizer``, ``collector``, ``engine``, ``dp``...)."""

    def _sft_step(self) -> dict[str, float]:
        from gym_llm_adapters.types import RolloutBatch

        cfg = self.config
        rng = np.random.default_rng([cfg.seed, self.state.step])
        rows = rng.choice(len(self._sft_examples), size=min(cfg.sft_batch_size, len(self._sft_examples)), replace=False)
        if self.dp is not None:  # the same minibatch drawn on every rank; each takes its share, over the global tokens
            rows = rows[self.dp.rank::self.dp.world]
        batch = RolloutBatch.from_trajectories([self._sft_examples[i] for i in rows], pad_id=self._pad_id()) \
            if len(rows) else None
        total, tokens = 0.0, int(batch.policy_mask.sum()) if batch is not None else 0
        if self.dp is not None:
            (tokens,) = (int(v) for v in self.dp.sum(tokens))
        parts = [part for part, _ in self._micro_batches(batch)] if batch is not None else []
        for _, part in self._micro_steps(parts):
            if part is None:  # FSDP2: a rank with fewer micro-batches joins the others' collectives
                self._padding_backward()
                continue
            t = part.to_torch(self.device)
            out = self._sft_loss.from_batch(self._logprobs(t, sampled=False), part, num_items=tokens)
            out.loss.backward()
            total += float(out.loss.detach())
        if self.dp is not None:
            (total,) = self.dp.sum(total)
        lr = self.scheduler.get_last_lr()[0]  # this step's rate (the scheduler moves on in _optimizer_step)
        grad_norm = self._optimizer_step()
        self._stale_engine = True
        return {"sft/loss": total, "sft/tokens": float(tokens), "sft/grad_norm": grad_norm, "sft/lr": lr}

    def _grpo_step(self) -> dict[str, float]:
        from gym_llm_adapters.reward_stages import judge_usage
        from gym_llm_adapters.types import RolloutBatch

        cfg = self.config
        clock = PhaseClock()
        stats = self.collector.stats
        generate_s, env_s, judge_s = stats.generate_s, stats.env_s, stats.reward_stage_s
        engine_tokens = stats.prompt_tokens + stats.generated_tokens
        calls, judge_tokens = judge_usage(self.collector.reward_stages)
        metrics: dict[str, float] = {}
        if self._overlap is None:
            trajectories = self.collector.next_batch()
            clock.lap("rollout")
            clock.parts["rollout_generate"] = generate_s = stats.generate_s - generate_s
            clock.parts["rollout_env"] = stats.env_s - env_s
            if self.collector.reward_stages:
                clock.parts["rollout_judge"] = stats.reward_stage_s - judge_s
            engine_tokens = stats.prompt_tokens + stats.generated_tokens - engine_tokens
        else:  # generated while earlier steps trained: "rollout" is the wait for it; its own times are logged apart
            got = self._overlap.next_batch()
            trajectories, generate_s, engine_tokens = got.trajectories, got.generate_s, got.engine_tokens
            clock.lap("rollout")
            metrics.update({"time/overlap_generate_s": got.generate_s, "time/overlap_env_s": got.env_s,
                            "train/batches_ahead": float(self._overlap.ahead)})
        if self.dp is not None:  # group ids unique over the ranks (rank r's groups follow rank r-1's)
            trajectories = _offset_groups(trajectories, self.dp.rank * self._tasks_per_rank())
        written = trajectories
        if cfg.async_steps:  # no token older than the bound is trained on: its whole group is refused
            from gym_llm_adapters.training.overlap import stale_groups

            refused = stale_groups(trajectories, current=self.engine.version, k=cfg.async_steps)
            trajectories = [t for t in trajectories if (t.group_id, t.round) not in refused]
            metrics["train/stale_refused"] = float(len(written) - len(trajectories))
            versions = [min(t.versions) for t in trajectories if t.versions]
            metrics["train/version_lag"] = float(self.engine.version - min(versions)) if versions else 0.0
        if trajectories:
            batch = self.advantage(RolloutBatch.from_trajectories(trajectories, pad_id=self._pad_id()))
            failed = self.advantage.last_dropped_failed  # unknown rewards (a judge's failure): out of the loss, counted
        else:
            batch, failed = _empty_batch(), 0
        current = self.engine.version  # the weights the policy has now (pushed after every step)
        counted = self.loss_fn.counted_tokens(batch, current_version=current)
        rows = len(batch)
        judge_use = [0.0, 0.0]
        if self.collector.reward_stages:
            now_calls, now_tokens = judge_usage(self.collector.reward_stages)
            judge_use = [float(now_calls - calls), float(now_tokens - judge_tokens)]
        if self.dp is not None:  # the global batch's sizes: every rank normalises its share by them
            failed, counted, rows, *judge_use = (int(v) for v in self.dp.sum(failed, counted, rows, *judge_use))
        metrics["train/reward_failed"] = float(failed)
        if self.collector.reward_stages:
            metrics.update({"judge/calls": float(judge_use[0]), "judge/tokens": float(judge_use[1])})
        written = self._gather(written)  # every rank's, in rank order, on the writer (rank 0)
        if rows == 0:
            logger.warning("step skipped: none of the %d episodes can be trained on (%s)", len(written),
                           f"every reward failed: {trajectories[0].reward_error}" if trajectories else
                           f"older than the --async-steps bound of {cfg.async_steps} versions")
            if self._writer is not None:
                self._writer.write(written)
                self.state.rollout_records += len(written)
            return {**metrics, "train/version": float(self.engine.version)}
        kl_sum = 0.0
        if self.reference is not None and len(batch):
            kl = self.reference(batch)
            batch = dataclasses.replace(batch, ref_logprobs=kl.ref_logprobs.cpu().numpy().astype(np.float32))
            kl_sum = float(kl.kl.sum())
        clock.lap("reference")  # the advantage and batch building included (small)
        tokens = int(batch.policy_mask.sum())
        if self.dp is not None:
            kl_sum, tokens = self.dp.sum(kl_sum, tokens)
            tokens = int(tokens)
        if self.reference is not None:
            metrics["train/kl"] = kl_sum / max(tokens, 1)  # mean k3 KL per policy token
        share = len(batch) / rows  # this rank's rows of the global batch (1 in one process)
        loss_total, clip_low, clip_high, stale = 0.0, 0.0, 0.0, 0.0
        log_ratio_sum, log_ratio_max = 0.0, 0.0
        passes = cfg.num_iterations
        parts = [(part, weight * share) for part, weight in self._micro_batches(batch)] if len(batch) else []
        olds: list[Any] = [None] * len(parts)  # pi_old: the policy's log-probs before this batch's first update
        lr = self.scheduler.get_last_lr()[0]  # this step's rate (the scheduler moves on after the last pass)
        grad_norms = []
        for it in range(passes):
            for j, step_part in self._micro_steps(parts):
                if step_part is None:  # FSDP2: a rank with fewer micro-batches joins the others' collectives
                    self._padding_backward()
                    continue
                part, weight = step_part
                t = part.to_torch(self.device)
                logprobs = self._logprobs(t)
                if passes > 1 and it == 0:
                    olds[j] = logprobs.detach()  # taken once, at the first pass: later passes' ratio is against it
                out = self.loss_fn.from_batch(logprobs, part, old_logprobs=olds[j] if it > 0 else None,
                                              num_items=max(counted, 1), current_version=current)
                scale = 1.0 if cfg.aggregation == "token_mean" else weight
                (out.loss * scale).backward()
                loss_total += float(out.loss.detach()) * scale / passes
                clip_low += float(out.clip_low_fraction) * weight / passes
                clip_high += float(out.clip_high_fraction) * weight / passes
                stale += float(out.stale_fraction if out.stale_fraction is not None else 0.0) * weight / passes
                if it == 0:  # trainer vs engine log-prob of the same sampled tokens (both the processed distribution)
                    mask = t["policy_mask"]
                    diff = (logprobs.detach() - t["logprobs"])[mask].double()
                    log_ratio_sum += float(diff.sum())
                    log_ratio_max = max(log_ratio_max, float(diff.abs().max()) if diff.numel() else 0.0)
            clock.lap("policy")
            grad_norms.append(self._optimizer_step(schedule=it == passes - 1))
            clock.lap("optimizer")
        grad_norm = float(np.mean(grad_norms))
        if self.dp is not None:  # the per-row sums of every rank (each already weighted by its share of the rows)
            loss_total, clip_low, clip_high, stale, log_ratio_sum = self.dp.sum(
                loss_total, clip_low, clip_high, stale, log_ratio_sum)
            log_ratio_max = self.dp.max(log_ratio_max)
        version = self.sync.push() if self._overlap is None else self._overlap.push(self.sync)
        clock.lap("sync")
        if self._overlap is not None:  # the part of "sync" spent waiting for the batch in flight to finish
            metrics["time/overlap_push_wait_s"] = self._overlap.last_push_wait_s
        if self._writer is not None:
            self._writer.write(written)
            self.state.rollout_records += len(written)
        clock.lap("write")
        self._step_times.add(clock.parts)
        metrics.update(self._throughput(clock.parts, self._processed_tokens(batch) if len(batch) else 0,
                                        engine_tokens, generate_s))
        rewards = batch.rewards.astype(np.float64)
        if self.dp is not None:  # the global batch's rewards (scored rows)
            rewards = np.concatenate(self.dp.all_gather(rewards))
        metrics.update({
            "train/reward_mean": float(rewards.mean()), "train/reward_std": float(rewards.std()),
            "train/pass_rate": float((rewards >= cfg.pass_threshold).mean()), "train/loss": loss_total,
            "train/clip_low_fraction": clip_low, "train/clip_high_fraction": clip_high,
            "train/stale_fraction": stale, "train/engine_log_ratio_mean": log_ratio_sum / max(tokens, 1),
            "train/engine_log_ratio_abs_max": log_ratio_max,
            "train/policy_tokens_mean": tokens / rows, "train/grad_norm": grad_norm,
            "train/lr": lr, "train/version": float(version),
            "collector/tokens_per_s": self.collector.stats.tokens_per_s,
            **{f"time/{name}_s": seconds for name, seconds in clock.parts.items()},
        })
        return metrics

    def _processed_tokens(self, batch: Any) -> int:
        """Tokens a forward over ``batch`` runs: every real token, less the prompts ``share_prefix`` runs once per group
        instead of once per member (a row's prompt: the tokens before its first sampled one)."""
        from gym_llm_adapters.losses.advantages import group_keys

        total = int(batch.attention_mask.sum())
        if not self.config.share_prefix:
            return total
        prompts = batch.policy_mask.argmax(axis=1)  # (B,) first sampled position
        keys = group_keys(batch.group_ids, batch.rounds)
        shared = sum(int(prompts[keys == k].min()) * (int((keys == k).sum()) - 1) for k in np.unique(keys))
        return total - shared

    def _throughput(self, parts: dict[str, float], tokens: int, engine_tokens: int,
                    generate_s: float) -> dict[str, float]:
        """``perf/*`` metrics of one GRPO step: the policy's forward + backward (``num_iterations`` passes over the
        batch's ``tokens``), the reference's forward, and the engine's prompt + generated tokens."""
        from gym_llm_adapters.training.throughput import phase_throughput

        cfg, out = self.config, {}
        phases = [("policy", parts.get("policy", 0.0), tokens * cfg.num_iterations, 4 if self.peft_model else 6),
                  ("generate", generate_s, engine_tokens, 2)]
        if self.reference is not None:
            phases.append(("reference", parts.get("reference", 0.0), tokens, 2))
        for name, seconds, count, per_param in phases:
            values = phase_throughput(params=self._matmul_params, peak=self._peak, seconds=seconds, tokens=count,
                                      flops_per_param=per_param)
            out[f"perf/{name}_tokens_per_s"], out[f"perf/{name}_mfu"] = values["tokens_per_s"], values["mfu"]
        self._perf.add(out)
        return out

    def step_time(self) -> dict[str, float]:
        """Mean seconds per GRPO step of this run, by phase: ``rollout`` (of which ``rollout_generate`` in the engine
        and ``rollout_env`` in the envs' steps), ``reference`` (reference-model forward for the KL), ``policy``
        (log-prob forward + backward), ``optimizer``, ``sync`` (weights to the engine), ``write`` (rollout file).
        Empty before the first GRPO step."""
        return self._step_times.means()

    def _micro_batches(self, batch: Any):
        """``(part, len(part) / len(batch))`` slices of at most ``micro_batch_size`` rows and at most
        :func:`backward_token_budget` tokens (rows x the batch's padded width); one slice when both allow it.
        With ``share_prefix`` a slice holds whole groups where it can (a group's prompt then runs once)."""
        from gym_llm_adapters.losses import select_rows

        cfg = self.config
        size = cfg.micro_batch_size or len(batch)
        if self._token_budget is not None:
            size = min(size, max(1, self._token_budget // max(1, batch.input_ids.shape[1])))
        if cfg.share_prefix and cfg.group_size <= size < len(batch):
            size -= size % cfg.group_size
        for start in range(0, len(batch), size):
            rows = np.arange(start, min(start + size, len(batch)))
            yield (batch if len(rows) == len(batch) else select_rows(batch, rows)), len(rows) / len(batch)

    def _logprobs(self, t: dict[str, Any], *, sampled: bool = True) -> Any:
        """The policy's log-probs of the batch's policy tokens, with gradient: for RL, under the distribution the
        engine sampled from (temperature, top-p; the engine reports the same processed log-probs); for SFT
        (``sampled=False``), the model's own distribution."""
        from gym_llm_adapters.logprobs import token_logprobs

        cfg = self.config
        processing = {"temperature": cfg.temperature, "top_p": cfg.top_p} if sampled else {}
        with autocast(self.device, cfg.dtype):
            if self._root is not None:  # FSDP2: through the root's forward, one backbone forward per call
                return self._root(t["input_ids"], t["attention_mask"], t["policy_mask"], **processing)
            return token_logprobs(self.policy, t["input_ids"], t["attention_mask"], t["policy_mask"],
                                  max_tokens_per_forward=8192, share_prefix=cfg.share_prefix and sampled,
                                  **processing)

    def _micro_steps(self, parts: list[Any]):
        """``(index, part)`` for each micro-batch of one optimizer pass. Under FSDP2 every rank runs as many as the
        rank with the most (``part`` None for the missing ones: :meth:`_padding_backward`), since each forward and
        backward issues collectives, and the gradients are reduced at the pass's last backward only."""
        if self._root is None:
            yield from enumerate(parts)
            return
        count = int(self.dp.max(len(parts)))
        for j in range(count):
            self._root.set_requires_gradient_sync(j == count - 1)
            yield j, parts[j] if j < len(parts) else None

    def _padding_backward(self) -> None:
        """A forward and backward whose gradient is exactly zero (training/fsdp.py :func:`padding_pass`)."""
        from gym_llm_adapters.training.fsdp import padding_pass

        with autocast(self.device, self.config.dtype):
            loss = padding_pass(self._root, self.device)
        loss.backward()

    def _optimizer_step(self, schedule: bool = True) -> float:
        """Clip, step and zero the gradients; ``schedule``: move the learning-rate schedule on (once per trainer step,
        after its last pass over the batch)."""
        import torch

        if self.dp is not None and self._root is None:  # DDP: summed over the ranks, every replica the same step
            self.dp.all_reduce_grads(self.policy.parameters())  # (FSDP2 reduce-scattered them in the backward)
        params = [p for p in self.policy.parameters() if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, self.config.max_grad_norm or float("inf"))
        self.optimizer.step()
        if schedule:
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm.full_tensor()) if hasattr(norm, "full_tensor") else float(norm)

    def _tasks_per_rank(self) -> int:
        """Groups this process generates per step: ``num_tasks``, or its share under data parallelism."""
        return self.config.num_tasks // (self.dp.world if self.dp is not None else 1)

    def _gather(self, trajectories: list[Any]) -> list[Any]:
        """Every rank's trajectories, in rank order, on the writer (rank 0); ``[]`` elsewhere. Collective when the run
        writes rollouts."""
        if self.dp is None:
            return trajectories
        if not self.config.write_rollouts:
            return []
        gathered = self.dp.gather(trajectories)
        return [t for part in gathered for t in part] if gathered is not None else []


def _empty_batch() -> Any:
    """A batch of no rows (every group of this step refused or failed; under data parallelism the rank still joins
    the step's collectives)."""
    from gym_llm_adapters.types import RolloutBatch

    return RolloutBatch(**{f.name: np.zeros((0, 0) if f.name in _TOKEN_FIELDS else (0,),
                                            dtype=np.float32 if f.name in ("logprobs", "rewards") else np.int64)
                           for f in dataclasses.fields(RolloutBatch) if f.default is dataclasses.MISSING})


_TOKEN_FIELDS = ("input_ids", "attention_mask", "policy_mask", "logprobs")


def _offset_groups(trajectories: list[Any], offset: int) -> list[Any]:
    """``group_id + offset`` for each trajectory (a data-parallel rank's groups, numbered after the ranks before it)."""
    if not offset:
        return trajectories
    return [dataclasses.replace(t, group_id=t.group_id + offset) for t in trajectories]
