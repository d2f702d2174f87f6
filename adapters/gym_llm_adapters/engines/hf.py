"""Transformers engine: the fallback policy (no vLLM) and the reference model for KL.

Generation is our own batched decoding loop over a Hugging Face causal LM rather than
``model.generate``: the loop needs the raw log-prob of every sampled token, per-row finish reasons for
eos, stop ids and stop strings, and the option to compact finished rows out of the KV cache — all
awkward to recover from ``generate``'s padded output (pad often equals eos). It is ~60 lines over the
model's forward and ``DynamicCache``.

Prompts are left-padded into batches of at most ``max_batch_size`` rows; position ids come from the
attention mask, so a padded row computes exactly what it would alone (tested).

LoRA (``lora_rank=R``): the engine serves a PEFT adapter on its model. The first :meth:`HFEngine.load_adapter` wraps
the model with PEFT *in place* (its targeted linear layers get LoRA layers; ``engine.model`` stays the transformers
model and computes base + adapter); each later load adds the new version's adapter under its own name, makes it the
active one and deletes the previous one. The adapter's files are read and checked before the model is touched, and
an adapter that fails to go in is removed again, so a failed load leaves the previous adapter served.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from gym_llm_adapters.engines.base import EngineBase, LogprobsMode, SamplingConfig
from gym_llm_adapters.types import Completion

if TYPE_CHECKING:
    from gym_llm_adapters.lora import Adapter

__all__ = ["HFEngine"]

logger = logging.getLogger(__name__)

_STOP_TAIL_TOKENS_PER_CHAR = 4  # a character may take up to 4 byte-level tokens


class HFEngine(EngineBase):
    """A transformers causal LM behind the :class:`~gym_llm_adapters.engines.base.Engine` protocol.

    Args:
        model: a checkpoint folder / hub id, or a loaded ``PreTrainedModel`` (used as is, not copied).
        tokenizer: default ``AutoTokenizer.from_pretrained(model)`` when ``model`` is a path.
        device: where a model loaded from a path goes (default: ``"cpu"``).
        dtype: the dtype a model loaded from a path gets (default: float32).
        max_batch_size: most rows per decoding batch (prompts x samples).
        forward_token_budget: most (padded) tokens per teacher-forcing forward; bounds the
            ``(B, S, V)`` logits memory.
        logprobs_mode: ``"raw"`` (default) or ``"processed"`` (see the engines' module docstring).
        version: the initial policy version (default 0, or ``adapter.version``).
        lora_rank: serve LoRA adapters (PEFT) of rank up to this; ``None`` (default): no adapters. The first adapter
            wraps the model with PEFT in place, so give the engine a model of its own (a path, or a copy), never the
            trainer's.
        adapter: a LoRA adapter to serve from the start (a resumed run), at ``version=adapter.version``.
    """

    def __init__(
        self,
        model: Any,
        *,
        tokenizer: Any = None,
        device: Any = None,
        dtype: Any = None,
        max_batch_size: int = 64,
        forward_token_budget: int = 16_384,
        logprobs_mode: LogprobsMode = "raw",
        version: int | None = None,
        lora_rank: int | None = None,
        adapter: "Adapter | None" = None,
    ):
        import torch

        if logprobs_mode not in ("raw", "processed"):
            raise ValueError(f"logprobs_mode must be 'raw' or 'processed', got {logprobs_mode!r}.")
        if max_batch_size < 1 or forward_token_budget < 1:
            raise ValueError("max_batch_size and forward_token_budget must be >= 1.")
        if isinstance(model, (str, Path)):
            from transformers import AutoModelForCausalLM, AutoTokenizer

            path = str(model)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or torch.float32)
            model.to(device or "cpu")
            if tokenizer is None:
                tokenizer = AutoTokenizer.from_pretrained(path)
        elif not hasattr(model, "forward") or not hasattr(model, "config"):
            raise TypeError(f"model must be a checkpoint path or a transformers PreTrainedModel, got {type(model).__name__}.")
        if tokenizer is None:
            raise ValueError("HFEngine(model=<PreTrainedModel>) needs tokenizer= as well.")
        if lora_rank is not None:
            if isinstance(lora_rank, bool) or not isinstance(lora_rank, int) or lora_rank < 1:
                raise ValueError(f"lora_rank must be an int >= 1 (the largest adapter rank served), got {lora_rank!r}.")
            if hasattr(model, "peft_config"):
                raise ValueError("HFEngine(lora_rank=...) wraps its model with PEFT itself; it got a PEFT model (the "
                                 "trainer's?). Give it the base model of its own (a path or a copy), or sample from the "
                                 "PEFT model directly with HFEngine(peft_model) and no lora_rank.")
        super().__init__(tokenizer, version=version, adapter=adapter)
        self._lora_rank = lora_rank
        self._peft: Any = None  # the PeftModel over self.model, made at the first adapter load
        self.model = model
        self.max_batch_size = int(max_batch_size)
        self.forward_token_budget = int(forward_token_budget)
        self.logprobs_mode = logprobs_mode
        self.eos_token_ids = _eos_ids(model, tokenizer)
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_token_id = int(pad if pad is not None else (min(self.eos_token_ids) if self.eos_token_ids else 0))
        self._serve_initial_adapter(adapter)

    @property
    def device(self) -> Any:
        return next(self.model.parameters()).device

    # ---------------------------------------------------------------------------- generation
    def _generate_ids(self, prompts: list[np.ndarray], sampling: SamplingConfig) -> list[Completion]:
        import torch

        rows = [p for p in prompts for _ in range(sampling.n)]  # prompt-major
        generator = None
        if sampling.seed is not None:
            generator = torch.Generator(device=self.device).manual_seed(int(sampling.seed))
        out: list[Completion] = []
        for start in range(0, len(rows), self.max_batch_size):
            out.extend(self._generate_batch(rows[start: start + self.max_batch_size], sampling, generator))
        return out

    def _generate_batch(self, prompts: list[np.ndarray], sampling: SamplingConfig, generator: Any) -> list[Completion]:
        import torch
        from transformers import DynamicCache

        B, P = len(prompts), max(len(p) for p in prompts)
        dev = self.device
        input_ids = torch.full((B, P), self.pad_token_id, dtype=torch.long, device=dev)  # (B, P), left-padded
        attention = torch.zeros((B, P), dtype=torch.long, device=dev)
        for b, p in enumerate(prompts):
            input_ids[b, P - len(p):] = torch.as_tensor(p, device=dev)
            attention[b, P - len(p):] = 1
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        stop_ids = torch.tensor(sorted(set(sampling.stop_token_ids) | (set() if sampling.ignore_eos else self.eos_token_ids)),
                                dtype=torch.long, device=dev)
        tokens: list[list[int]] = [[] for _ in range(B)]
        logps: list[list[float]] = [[] for _ in range(B)]
        reasons = ["length"] * B
        live = torch.arange(B, device=dev)  # batch row -> prompt index; finished rows are dropped
        cache = DynamicCache(config=self.model.config)
        with torch.inference_mode():
            logits = self.model(input_ids=input_ids, attention_mask=attention, position_ids=positions,
                                past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1]  # (B, V)
            for step in range(sampling.max_tokens):
                token, logp = self._sample(logits, sampling, generator)  # (b,), (b,)
                finished = torch.isin(token, stop_ids)
                token_list, logp_list, fin_list = token.tolist(), logp.tolist(), finished.tolist()
                for row, b in enumerate(live.tolist()):
                    tokens[b].append(token_list[row])
                    logps[b].append(logp_list[row])
                    if fin_list[row] or (sampling.stop and self._hit_stop(tokens[b], sampling.stop)):
                        fin_list[row] = True
                        reasons[b] = "stop"
                keep = torch.tensor([not f for f in fin_list], dtype=torch.bool, device=dev)
                if not keep.any() or step + 1 == sampling.max_tokens:
                    break
                if not keep.all():  # compact: drop finished rows from the batch and the KV cache
                    index = keep.nonzero().squeeze(-1)
                    cache.batch_select_indices(index)
                    live, token, attention, positions = live[index], token[index], attention[index], positions[index]
                attention = torch.cat([attention, attention.new_ones((len(live), 1))], dim=-1)
                positions = positions[:, -1:] + 1
                logits = self.model(input_ids=token[:, None], attention_mask=attention, position_ids=positions,
                                    past_key_values=cache, use_cache=True).logits[:, -1]
        return [self._completion(prompts[b], tokens[b], logps[b], reasons[b], sampling) for b in range(B)]

    def _sample(self, logits: Any, sampling: SamplingConfig, generator: Any) -> tuple[Any, Any]:
        """One token per row and its log-prob: ``(b,)`` ids and ``(b,)`` float32 log-probs."""
        import torch

        logits = logits.float()  # (b, V)
        raw = torch.log_softmax(logits, dim=-1)
        if sampling.greedy:
            token = logits.argmax(-1)
            processed = raw
        else:
            scores = logits / sampling.temperature
            if sampling.top_k > 0 or sampling.top_p < 1.0:  # the same kept set the trainer's log-probs use
                from gym_llm_adapters.logprobs import restrict_to_sampled_set

                scores = restrict_to_sampled_set(scores, top_k=sampling.top_k, top_p=sampling.top_p)
            processed = torch.log_softmax(scores, dim=-1)
            token = torch.multinomial(processed.exp(), 1, generator=generator).squeeze(-1)
        table = raw if self.logprobs_mode == "raw" else processed
        return token, table.gather(-1, token[:, None]).squeeze(-1)

    def _hit_stop(self, tokens: list[int], stop: Sequence[str]) -> bool:
        """Whether the newest token completed a stop string (decodes only the tail)."""
        window = _STOP_TAIL_TOKENS_PER_CHAR * max(len(s) for s in stop) + 1
        tail = self.tokenizer.decode(tokens[-window:], skip_special_tokens=True)
        return any(s in tail for s in stop)

    # ------------------------------------------------------------------------ teacher forcing
    def logprobs(self, sequences: Sequence[Any]) -> list[np.ndarray]:
        """Teacher-forced raw log-probs: ``out[b][t] = log_softmax(logits[b, t-1])[seq[b][t]]``, ``out[b][0] = 0``.

        Sequences are right-padded into forwards of at most ``forward_token_budget`` padded tokens.
        """
        self._check_open()
        ids = self.prompt_ids(sequences)
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))  # similar lengths share a forward
        result: list[np.ndarray | None] = [None] * len(ids)
        chunk: list[int] = []
        for i in order:
            if chunk and (len(chunk) + 1) * len(ids[i]) > self.forward_token_budget:
                self._logprobs_chunk(ids, chunk, result)
                chunk = []
            chunk.append(i)
        if chunk:
            self._logprobs_chunk(ids, chunk, result)
        return result  # type: ignore[return-value]

    def _logprobs_chunk(self, ids: list[np.ndarray], chunk: list[int], result: list[np.ndarray | None]) -> None:
        import torch

        dev = self.device
        B, S = len(chunk), max(len(ids[i]) for i in chunk)
        input_ids = torch.full((B, S), self.pad_token_id, dtype=torch.long, device=dev)  # (B, S), right-padded
        attention = torch.zeros((B, S), dtype=torch.long, device=dev)
        for b, i in enumerate(chunk):
            input_ids[b, : len(ids[i])] = torch.as_tensor(ids[i], device=dev)
            attention[b, : len(ids[i])] = 1
        with torch.inference_mode():
            logits = self.model(input_ids=input_ids, attention_mask=attention).logits  # (B, S, V)
            logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)  # (B, S-1, V)
            target = logp.gather(-1, input_ids[:, 1:, None]).squeeze(-1)  # (B, S-1)
        target = target.cpu().numpy()
        for b, i in enumerate(chunk):
            out = np.zeros(len(ids[i]), dtype=np.float32)
            out[1:] = target[b, : len(ids[i]) - 1]
            result[i] = out

    # ------------------------------------------------------------------------------- weights
    def _load_weights(self, items: list[tuple[str, Any]]) -> None:
        import torch

        params = self.model.state_dict(keep_vars=True)  # every name, tied aliases included
        if self._peft is not None:  # PEFT moved each adapted layer's own weight to `<layer>.base_layer.weight`
            items = [(_base_layer_name(name, params), tensor) for name, tensor in items]
        unknown = [name for name, _ in items if name not in params]
        if unknown:
            raise ValueError(
                f"load_weights got {len(unknown)} names the model does not have, e.g. {unknown[:3]}; "
                f"expected Hugging Face names such as {list(params)[:3]}."
            )
        for name, tensor in items:
            if tuple(tensor.shape) != tuple(params[name].shape):
                raise ValueError(f"load_weights: {name} has shape {tuple(tensor.shape)}, the model's is {tuple(params[name].shape)}.")
        with torch.no_grad():
            for name, tensor in items:
                params[name].copy_(tensor)


    # ------------------------------------------------------------------------------ adapters
    @property
    def serves_adapters(self) -> bool:
        return self._lora_rank is not None

    @property
    def max_lora_rank(self) -> int | None:
        return self._lora_rank

    def _load_adapter(self, adapter: "Adapter", previous: "Adapter | None") -> None:
        from peft import LoraConfig, PeftModel
        from peft.utils import set_peft_model_state_dict
        from safetensors.torch import load_file

        from gym_llm_adapters.lora import ADAPTER_WEIGHTS

        config = LoraConfig.from_pretrained(str(adapter.path))  # read both files before touching the model
        config.inference_mode = True
        state = load_file(str(adapter.path / ADAPTER_WEIGHTS), device=str(self.device))
        first = self._peft is None
        if first:
            peft = PeftModel(self.model, config, adapter_name=adapter.name)  # wraps self.model's layers in place
        else:
            peft = self._peft
            peft.add_adapter(adapter.name, config)
        try:
            result = set_peft_model_state_dict(peft, state, adapter_name=adapter.name)
            unexpected = list(getattr(result, "unexpected_keys", []) or [])
            missing = [k for k in getattr(result, "missing_keys", []) or [] if f".{adapter.name}." in k]
            if unexpected or missing:
                raise ValueError(f"The adapter at {adapter.path} does not fit this model: "
                                 f"{len(unexpected)} tensors it has no place for (e.g. {unexpected[:2]}), "
                                 f"{len(missing)} of its own left unset (e.g. {missing[:2]}).")
            peft.set_adapter(adapter.name, inference_mode=True)
        except BaseException:
            if first:
                peft.unload()  # the model's layers as they were
            else:
                peft.delete_adapter(adapter.name)
                peft.set_adapter(previous.name if previous is not None else peft.active_adapter, inference_mode=True)
            raise
        if previous is not None and previous.name in peft.peft_config:
            peft.delete_adapter(previous.name)
        self._peft = peft
        self.model.eval()  # the adapter's dropout off


def _base_layer_name(name: str, params: dict[str, Any]) -> str:
    """``name`` as the model calls it once PEFT wrapped the layer: ``a.q_proj.weight`` -> ``a.q_proj.base_layer.weight``."""
    if name in params:
        return name
    head, _, leaf = name.rpartition(".")
    wrapped = f"{head}.base_layer.{leaf}"
    return wrapped if wrapped in params else name


def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
    """The ids that end generation: the tokenizer's eos plus the generation config's (as vLLM does)."""
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), tokenizer):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(value, int):
            ids.add(value)
        elif value:
            ids.update(int(v) for v in value)
    return ids
