"""Teacher-forced per-token log-probs of the exact tokens in a batch, without a ``(B, S, V)`` log-softmax.

``token_logprobs`` runs a causal LM's backbone once, then projects only the hidden states of the positions
that are scored (``score_mask``, usually the policy mask) through the output head, in row chunks sized to a
memory budget. Per chunk it computes ``logsumexp`` over the vocabulary and gathers the target logit, so the
largest temporary is one ``(rows_per_chunk, V)`` logits tile, never a full ``(B, S, V)`` float copy.

Formula (positions follow :mod:`gym_llm_adapters.types`: the value at ``t`` scores ``token_t``)::

    z_t   = W h_{t-1} (+ b),   s_t = z_t / temperature                 # (V,)
    K_t   = {v : s_t[v] >= f_t}                                         # the tokens the sampler may draw
    out_t = s_t[token_t] - logsumexp(s_t[K_t])   where score_mask[t] == 1, else 0.0

Without top-k/top-p, ``K_t`` is the whole vocabulary. With them, ``f_t`` is the smallest logit the sampler keeps:
top-k keeps the ``top_k`` largest, then top-p keeps, in descending order, every token whose preceding
probability mass (within the top-k) is ``< top_p`` — vLLM's and transformers' rule — so ``out_t`` is the log-prob
of the distribution actually sampled from (vLLM's ``logprobs_mode="processed_logprobs"``). A scored token that
this rule would have cut (the engine's kernels round differently at the boundary, or the tokens were not sampled
with these settings) joins ``K_t`` itself, so every scored log-prob is finite. ``K_t`` is piecewise constant in the weights; the gradient is that of the
renormalised softmax on ``K_t``.

With autograd enabled, the projection is a custom :class:`torch.autograd.Function` whose backward recomputes
each tile and turns it in place into ``d out / d s = g * (onehot(token) - softmax(s))``, so the backward holds
one tile at a time too (the fused linear-cross-entropy idea; Wijmans et al. 2024, "Cut your losses in
large-vocabulary language models").

Models whose head is not a plain linear layer (logit soft-capping, logit scaling) take the exact fallback:
the model's own forward, then ``log_softmax`` over the scored rows only.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

__all__ = ["token_logprobs", "restrict_to_sampled_set", "DEFAULT_CHUNK_BYTES"]

logger = logging.getLogger(__name__)

#: Memory budget of one logits tile (rows x vocabulary x element size); 128 MiB keeps peak memory low
#: while each matmul stays large enough to run at full speed.
DEFAULT_CHUNK_BYTES = 128 << 20

# Config attributes that mean "the logits are not just W h + b": such models take the exact fallback.
_HEAD_TRANSFORM_ATTRS = (
    "final_logit_softcapping",
    "logit_scale",
    "logits_scaling",
    "lm_head_multiplier",
    "output_multiplier",
)


def _rows_per_chunk(vocab_size: int, chunk_bytes: int) -> int:
    return max(1, chunk_bytes // (vocab_size * 4))


def _nucleus_floor(tile: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """``(n, V) -> (n,)`` the smallest scaled logit each row keeps under top-k, then top-p (module docstring).

    >>> _nucleus_floor(torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])), 0, 0.8)  # 0.5 + 0.3 reaches 0.8
    tensor([-1.2040])
    >>> _nucleus_floor(torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])), 1, 1.0)
    tensor([-0.6931])
    """
    values = tile.sort(dim=-1, descending=True).values  # (n, V)
    if 0 < top_k < values.shape[1]:
        values = values[:, :top_k]
    if top_p >= 1.0:
        return values[:, -1].clone()
    probs = values.softmax(-1)  # (n, k)
    before = probs.cumsum(-1).sub_(probs)  # probability mass strictly above each token
    kept = (before < top_p).sum(-1, keepdim=True)  # >= 1: the first token has nothing above it
    return values.gather(1, kept - 1).squeeze(1)


def restrict_to_sampled_set(scores: torch.Tensor, *, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """``(n, V)`` temperature-scaled logits with every token top-k / top-p would drop set to ``-inf`` (a new
    tensor): the rule of the module docstring, shared by the transformers engine's sampler and
    :func:`token_logprobs`, so both describe the same distribution."""
    if top_k <= 0 and top_p >= 1.0:
        return scores
    return _restrict(scores.clone(), _nucleus_floor(scores, top_k, top_p))


def _restrict(tile: torch.Tensor, floor: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
    """Set the logits below each row's floor to -inf, in place, except each row's target (kept in any case)."""
    drop = tile < floor[:, None]  # (n, V)
    if targets is not None:
        drop.scatter_(1, targets[:, None], False)
    return tile.masked_fill_(drop, float("-inf"))


def _logits_tile(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                 inv_temperature: float) -> torch.Tensor:
    """``(n, H) -> (n, V)`` float32 scaled logits ``(h W^T + b) / temperature``."""
    tile = hidden @ weight.t() if bias is None else torch.addmm(bias, hidden, weight.t())  # (n, V)
    if tile.dtype != torch.float32:
        tile = tile.float()
    if inv_temperature != 1.0:
        tile.mul_(inv_temperature)
    return tile


class _LinearTokenLogProb(torch.autograd.Function):
    """``out[i] = log_softmax((h_i W^T + b) / T)[target_i]`` for ``h: (N, H)``, chunked over rows; with
    ``top_k`` / ``top_p`` (optional trailing arguments) the softmax is over each row's kept set (module docstring)."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                targets: torch.Tensor, inv_temperature: float, rows: int, *processing: Any) -> torch.Tensor:
        top_k, top_p = (tuple(processing) + (0, 1.0))[:2] if processing else (0, 1.0)
        restricted = top_k > 0 or top_p < 1.0
        N = hidden.shape[0]
        out = torch.empty(N, dtype=torch.float32, device=hidden.device)  # (N,)
        lse = torch.empty(N, dtype=torch.float32, device=hidden.device)  # (N,)
        floor = torch.full((N,), float("-inf"), dtype=torch.float32, device=hidden.device)  # (N,)
        for start in range(0, N, rows):
            end = min(start + rows, N)
            tile = _logits_tile(hidden[start:end], weight, bias, inv_temperature)  # (n, V), ours to overwrite
            target_logit = tile.gather(1, targets[start:end, None]).squeeze(1)  # (n,)
            if restricted:
                floor[start:end] = _nucleus_floor(tile, top_k, top_p)
                _restrict(tile, floor[start:end], targets[start:end])
            # logsumexp in place on the tile: about 2x faster than torch.logsumexp on CPU, no extra (n, V) buffer.
            row_max = tile.amax(-1, keepdim=True)  # (n, 1)
            lse[start:end] = tile.sub_(row_max).exp_().sum(-1).log_().add_(row_max.squeeze(-1))
            out[start:end] = target_logit - lse[start:end]
        ctx.save_for_backward(hidden, weight, bias, targets, lse, floor)
        ctx.inv_temperature, ctx.rows, ctx.restricted, ctx.extra = inv_temperature, rows, restricted, len(processing)
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        hidden, weight, bias, targets, lse, floor = ctx.saved_tensors
        inv_t, rows = ctx.inv_temperature, ctx.rows
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        grad_b = torch.zeros(weight.shape[0], dtype=torch.float32, device=weight.device) if need_b else None
        grad_out = grad_out.float()
        for start in range(0, hidden.shape[0], rows):
            end = min(start + rows, hidden.shape[0])
            g = grad_out[start:end]  # (n,)
            tile = _logits_tile(hidden[start:end], weight, bias, inv_t)  # (n, V)
            if ctx.restricted:  # dropped tokens: -inf, so their softmax (and gradient) is 0
                _restrict(tile, floor[start:end], targets[start:end])
            # d out / d s = onehot(target) - softmax(s); times g, times 1/T for d s / d z; all in place.
            tile.sub_(lse[start:end, None]).exp_().mul_(-g[:, None])
            tile.scatter_add_(1, targets[start:end, None], g[:, None])
            if inv_t != 1.0:
                tile.mul_(inv_t)
            h = hidden[start:end]
            if grad_h is not None:
                grad_h[start:end] = (tile.to(weight.dtype) @ weight).to(hidden.dtype)  # (n, H)
            if grad_w is not None:
                grad_w.addmm_(tile.t(), h.float())  # (V, H)
            if grad_b is not None:
                grad_b += tile.sum(0)
        return (
            grad_h,
            None if grad_w is None else grad_w.to(weight.dtype),
            None if grad_b is None else grad_b.to(bias.dtype),
            None,
            None,
            None,
            *([None] * ctx.extra),
        )


def _fast_head(model: nn.Module) -> tuple[nn.Module, nn.Linear] | None:
    """The backbone and linear output head when logits are exactly ``head(backbone(x))``; else None."""
    config = getattr(model, "config", None)
    get_head = getattr(model, "get_output_embeddings", None)
    backbone = getattr(model, "base_model", None)
    if config is None or get_head is None or backbone is None or backbone is model:
        return None
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    if any(getattr(text_config, name, None) not in (None, 1.0) for name in _HEAD_TRANSFORM_ATTRS):
        return None
    head = get_head()
    if type(head) is not nn.Linear:
        return None
    return backbone, head


def _check_inputs(input_ids: torch.Tensor, attention_mask: torch.Tensor, score_mask: torch.Tensor) -> None:
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be (B, S); got shape {tuple(input_ids.shape)}.")
    for name, mask in (("attention_mask", attention_mask), ("score_mask", score_mask)):
        if mask.shape != input_ids.shape:
            raise ValueError(
                f"{name} must have input_ids' shape {tuple(input_ids.shape)}; got {tuple(mask.shape)}."
            )
    real, scored = attention_mask.bool(), score_mask.bool()
    if bool((scored & ~real).any()):
        raise ValueError("score_mask marks padding positions (attention_mask == 0); it must be a subset of it.")
    if bool((scored & (real.long().cumsum(-1) == 1)).any()):
        raise ValueError(
            "score_mask marks the first real token of a row: it has no context to score it. "
            "Sequences start with a prompt; put at least one token before the first sampled one."
        )


def _plan_forwards(attention_mask: torch.Tensor, micro_batch_size: int | None,
                   max_tokens_per_forward: int | None) -> list[tuple[list[int], int, int]]:
    """Split rows into forwards: ``(rows, first_col, end_col)``, each trimmed to its rows' real tokens.

    Rows are taken longest first, so each forward pads only up to its own longest row; a forward takes rows
    while ``rows <= micro_batch_size`` and ``rows * width <= max_tokens_per_forward``. Rows without real
    tokens are left out (their output is all zeros).
    """
    real = attention_mask.bool().cpu()
    B, S = real.shape
    cols = torch.arange(S)
    starts = torch.where(real, cols, S).amin(1).tolist()  # first real column per row
    ends = torch.where(real, cols + 1, 0).amax(1).tolist()  # one past the last real column
    order = sorted((r for r in range(B) if ends[r] > 0), key=lambda r: starts[r] - ends[r])  # longest first
    plan: list[tuple[list[int], int, int]] = []
    rows: list[int] = []
    lo, hi = S, 0
    for r in order:
        new_lo, new_hi = min(lo, starts[r]), max(hi, ends[r])
        full = (micro_batch_size is not None and len(rows) >= micro_batch_size) or (
            max_tokens_per_forward is not None and (len(rows) + 1) * (new_hi - new_lo) > max_tokens_per_forward)
        if rows and full:
            plan.append((rows, lo, hi))
            rows, new_lo, new_hi = [], starts[r], ends[r]
        rows.append(r)
        lo, hi = new_lo, new_hi
    if rows:
        plan.append((rows, lo, hi))
    return plan


def _score_rows(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                score_mask: torch.Tensor, inv_temperature: float, chunk_bytes: int,
                processing: tuple[int, float] = (0, 1.0)) -> torch.Tensor:
    """``(b, L)`` log-probs at ``score_mask`` positions (0.0 elsewhere) of one forward's rows."""
    # Positions from the attention mask: left- and right-padded rows score the same tokens identically.
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # (b, L)
    select = score_mask.bool()  # (b, L); column 0 is never scored (checked by _check_inputs)
    shifted = select[:, 1:]  # (b, L-1): hidden at t-1 scores token t
    targets = input_ids[:, 1:][shifted]  # (N,)
    fast = _fast_head(model)
    if fast is None:
        logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                       use_cache=False).logits  # (b, L, V)
        rows = logits[:, :-1][shifted].float() * inv_temperature  # (N, V)
        if processing != (0, 1.0):
            with torch.no_grad():
                drop = rows < _nucleus_floor(rows, *processing)[:, None]
                drop.scatter_(1, targets[:, None], False)
            rows = rows.masked_fill(drop, float("-inf"))
        flat = rows.log_softmax(-1).gather(1, targets[:, None]).squeeze(1)
    else:
        backbone, head = fast
        hidden = backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                          use_cache=False).last_hidden_state  # (b, L, H)
        flat = _head_logprobs(head, hidden[:, :-1][shifted], targets, inv_temperature, chunk_bytes, processing)
    out = torch.zeros(select.shape, dtype=torch.float32, device=input_ids.device)
    # masked_scatter keeps the result connected to the graph (and works when nothing is scored).
    return out.masked_scatter(select, flat.float())


def _prefix_groups(input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   score_mask: torch.Tensor) -> list[list[tuple[int, int, int, int]]]:
    """Rows that share their prefix: groups (of >= 2) of ``(row, start, first, end)`` whose tokens
    ``[start, first)`` are identical, ``first`` being the row's first scored column and ``[start, end)`` its
    real tokens (rows with padding inside them are left out)."""
    real, scored = attention_mask.bool().cpu(), score_mask.bool().cpu()
    ids = input_ids.cpu()
    cols = torch.arange(real.shape[1])
    starts = torch.where(real, cols, real.shape[1]).amin(1).tolist()
    ends = torch.where(real, cols + 1, 0).amax(1).tolist()
    firsts = torch.where(scored, cols, real.shape[1]).amin(1).tolist()
    counts = real.sum(1).tolist()
    by_prefix: dict[bytes, list[tuple[int, int, int, int]]] = {}
    for r, (lo, first, hi) in enumerate(zip(starts, firsts, ends)):
        if first >= hi or counts[r] != hi - lo:  # nothing scored, or padding inside the row
            continue
        by_prefix.setdefault(ids[r, lo:first].numpy().tobytes(), []).append((r, lo, first, hi))
    return [group for group in by_prefix.values() if len(group) > 1]


def _prefix_cache_ok(model: nn.Module) -> bool:
    """Whether a prefix's KV cache may serve its continuations: a plain head and full attention everywhere."""
    if _fast_head(model) is None:
        return False
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    layer_types = getattr(config, "layer_types", None) or ()
    return all(kind == "full_attention" for kind in layer_types) and not getattr(config, "use_sliding_window", False)


def _shared_prefix_logprobs(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                            score_mask: torch.Tensor, groups: list[list[tuple[int, int, int, int]]],
                            temperature: float, chunk_bytes: int, processing: tuple[int, float],
                            micro_batch_size: int | None, max_tokens_per_forward: int | None) -> torch.Tensor:
    """:func:`token_logprobs` with one backbone forward per shared prefix (``share_prefix=True``).

    The prompts go through the backbone together (left-padded to the longest), then the continuations together
    (longest first, split like :func:`_plan_forwards`), each row attending to its own prompt's cached
    keys/values; so a batch of G groups takes two forwards, not 2G."""
    from transformers import DynamicCache

    backbone, head = _fast_head(model)
    B, S = input_ids.shape
    device = input_ids.device
    parts, order = [], []
    shared = {r for group in groups for r, *_ in group}
    rest = [r for r in range(B) if r not in shared]
    if rest:  # rows that share nothing: the ordinary path
        index = torch.tensor(rest, device=device)
        parts.append(token_logprobs(model, input_ids[index], attention_mask[index], score_mask[index],
                                    temperature=temperature, top_k=processing[0], top_p=processing[1],
                                    micro_batch_size=micro_batch_size, max_tokens_per_forward=max_tokens_per_forward,
                                    chunk_bytes=chunk_bytes))
        order += rest
    groups = sorted(groups, key=lambda group: group[0][1] - group[0][2])  # longest prompt first
    prompt_sets = _chunks([(g, 0, group[0][1], group[0][2]) for g, group in enumerate(groups)],
                          micro_batch_size, max_tokens_per_forward, bucket=False)
    for prompt_set in prompt_sets:
        prompts = [g for g, *_ in prompt_set]
        lengths = torch.tensor([groups[g][0][2] - groups[g][0][1] for g in prompts], device=device)  # (n,)
        P = int(lengths.max())
        ids = torch.zeros(len(prompts), P, dtype=input_ids.dtype, device=device)
        real = torch.zeros(len(prompts), P, dtype=attention_mask.dtype, device=device)
        for i, g in enumerate(prompts):  # left-padded: every prompt's last token in the last column
            r, lo, first, _ = groups[g][0]
            ids[i, P - (first - lo):] = input_ids[r, lo:first]
            real[i, P - (first - lo):] = 1
        out = backbone(input_ids=ids, attention_mask=real, position_ids=(real.long().cumsum(-1) - 1).clamp(min=0),
                       use_cache=True)
        last = out.last_hidden_state[:, -1]  # (n, H): scores each continuation's first token
        kv = [(layer.keys, layer.values) for layer in out.past_key_values.layers]  # (n, heads, P, d) each
        rows = sorted(((r, i, first, hi) for i, g in enumerate(prompts) for r, _, first, hi in groups[g]),
                      key=lambda row: row[2] - row[3])  # longest continuation first
        for chunk in _chunks(rows, micro_batch_size, max_tokens_per_forward):
            g, L = len(chunk), max(hi - first for _, _, first, hi in chunk)
            prompt = torch.tensor([i for _, i, _, _ in chunk], device=device)  # (g,) each row's prompt
            ids = torch.zeros(g, L, dtype=input_ids.dtype, device=device)
            real_rows = torch.zeros(g, L, dtype=attention_mask.dtype, device=device)
            select = torch.zeros(g, L, dtype=torch.bool, device=device)
            for j, (r, _, first, hi) in enumerate(chunk):
                ids[j, : hi - first] = input_ids[r, first:hi]
                real_rows[j, : hi - first] = 1
                select[j, : hi - first] = score_mask[r, first:hi].bool()
            cache = DynamicCache([(k.index_select(0, prompt), v.index_select(0, prompt)) for k, v in kv])
            positions = lengths[prompt, None] + torch.arange(L, device=device)  # (g, L)
            hidden = backbone(input_ids=ids, attention_mask=torch.cat([real[prompt], real_rows], 1),
                              past_key_values=cache, position_ids=positions, use_cache=True).last_hidden_state
            hidden = torch.cat([last[prompt, None], hidden[:, :-1]], 1)  # (g, L, H): h_{t-1} for token t
            flat = _head_logprobs(head, hidden[select], ids[select], 1.0 / temperature, chunk_bytes, processing)
            chunk_rows = [r for r, *_ in chunk]
            rows_mask = score_mask[torch.tensor(chunk_rows, device=device)].bool()  # (g, S): same positions, in order
            parts.append(torch.zeros(g, S, dtype=torch.float32, device=device).masked_scatter(rows_mask, flat.float()))
            order += chunk_rows
    out = torch.zeros(B, S, dtype=torch.float32, device=device)
    return out.index_copy(0, torch.tensor(order, device=device), torch.cat(parts))


def _chunks(group: list[tuple[int, int, int, int]], micro_batch_size: int | None,
            max_tokens_per_forward: int | None, bucket: bool = True) -> list[list[tuple[int, int, int, int]]]:
    """``(..., start, end)`` spans, longest first, split as :func:`_plan_forwards` splits rows, and (``bucket``)
    where a span is shorter than half its chunk's longest (padding would then be most of the forward: e.g. a
    truncated sample among short ones)."""
    chunks: list[list[tuple[int, int, int, int]]] = []
    for row in group:
        if chunks:
            chunk = chunks[-1]
            width = chunk[0][3] - chunk[0][2]  # its longest continuation
            full = (micro_batch_size is not None and len(chunk) >= micro_batch_size) or (
                max_tokens_per_forward is not None and (len(chunk) + 1) * width > max_tokens_per_forward)
            if not full and (not bucket or 2 * (row[3] - row[2]) >= width):
                chunk.append(row)
                continue
        chunks.append([row])
    return chunks


def _head_logprobs(head: nn.Linear, hidden: torch.Tensor, targets: torch.Tensor, inv_temperature: float,
                   chunk_bytes: int, processing: tuple[int, float]) -> torch.Tensor:
    """``(N,)`` log-probs of ``targets`` under the head's processed distribution at ``hidden: (N, H)``."""
    weight, bias = head.weight, head.bias
    hidden = hidden.to(weight.dtype)
    rows_per_chunk = _rows_per_chunk(weight.shape[0], chunk_bytes)
    if processing != (0, 1.0):  # the sort behind the kept set needs a values + an int64 index tile
        rows_per_chunk = max(1, rows_per_chunk // 4)
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        return _LinearTokenLogProb.apply(hidden, weight, bias, targets, inv_temperature, rows_per_chunk, *processing)
    return _LinearTokenLogProb.forward(_NoCtx(), hidden, weight, bias, targets, inv_temperature, rows_per_chunk,
                                       *processing)


class _NoCtx:
    """Stands in for autograd's ctx when the forward runs without autograd (nothing is saved)."""

    def save_for_backward(self, *tensors: Any) -> None:
        pass


def token_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    score_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    micro_batch_size: int | None = None,
    max_tokens_per_forward: int | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    share_prefix: bool = False,
) -> torch.Tensor:
    """Per-token log-probs ``log p(token_t | tokens_<t)`` of a transformers causal LM at the scored positions.

    Args:
        model: a transformers causal LM (``AutoModelForCausalLM``-style: ``base_model`` + linear output head;
            other heads fall back to the model's own forward).
        input_ids: ``(B, S)`` int64 token ids (any padding side).
        attention_mask: ``(B, S)`` 1 for real tokens.
        score_mask: ``(B, S)`` 1 where a log-prob is wanted (the policy mask); must be 0 on padding and on
            each row's first real token.
        temperature / top_p / top_k: the sampler's settings: the log-prob is that of the distribution the
            sampler draws from (logits divided by ``temperature``, then restricted to the top-k / top-p set; module
            docstring). Match the engine's log-probs: ``logprobs_mode="processed"`` engines report exactly this;
            "raw" ones report ``temperature=1, top_p=1, top_k=0``. ``top_k=0`` and ``top_p=1`` disable them.
        micro_batch_size: at most this many rows per backbone forward; None = no row limit.
        max_tokens_per_forward: at most ``rows * padded_width`` tokens per backbone forward; None = no limit.
            Rows go longest first and each forward is trimmed to its own longest row, so a limit also cuts
            the compute spent on padding (on CPU, 2048-4096 is a good value). Both limits bound activation
            memory. Results do not depend on them.
        chunk_bytes: memory budget of one float32 ``(rows, V)`` logits tile.
        share_prefix: run each distinct prompt once. Rows whose tokens before their first scored position are
            identical (a GRPO group: one prompt, G samples) share one backbone forward of that prefix; its
            keys/values then serve the G continuations (transformers' KV cache, with autograd through it).
            The same values and gradients up to float rounding, at ``P + sum(L_i)`` instead of
            ``sum(P + L_i)`` tokens of backbone compute (prompt ``P``, continuations ``L_i``). Only for models
            with a plain linear head and full attention in every layer; others, and rows that share nothing,
            take the ordinary path.

    Returns:
        ``(B, S)`` float32, the log-prob at scored positions and 0.0 elsewhere. Differentiable with respect
        to the model's parameters when autograd is enabled (call under ``torch.no_grad()`` /
        ``torch.inference_mode()`` for a reference model).
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 (log-probs of greedy decoding are not defined); got {temperature}.")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1] (1 disables it); got {top_p}.")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise ValueError(f"top_k must be an int >= 0 (0 disables it); got {top_k!r}.")
    processing = (int(top_k), float(top_p))
    for name, limit in (("micro_batch_size", micro_batch_size), ("max_tokens_per_forward", max_tokens_per_forward)):
        if limit is not None and limit < 1:
            raise ValueError(f"{name} must be >= 1 or None; got {limit}.")
    _check_inputs(input_ids, attention_mask, score_mask)
    B, S = input_ids.shape
    if share_prefix:
        groups = _prefix_groups(input_ids, attention_mask, score_mask) if _prefix_cache_ok(model) else []
        if groups:
            return _shared_prefix_logprobs(model, input_ids, attention_mask, score_mask, groups, float(temperature),
                                           chunk_bytes, processing, micro_batch_size, max_tokens_per_forward)
    plan = _plan_forwards(attention_mask, micro_batch_size, max_tokens_per_forward)
    if len(plan) == 1 and plan[0] == (list(range(B)), 0, S):  # one forward over the whole batch
        return _score_rows(model, input_ids, attention_mask, score_mask, 1.0 / temperature, chunk_bytes, processing)
    parts, order = [], []
    for rows, lo, hi in plan:
        index = torch.tensor(rows, device=input_ids.device)
        part = _score_rows(model, input_ids[index, lo:hi], attention_mask[index, lo:hi], score_mask[index, lo:hi],
                           1.0 / temperature, chunk_bytes, processing)  # (b, hi - lo)
        parts.append(torch.nn.functional.pad(part, (lo, S - hi)))
        order += rows
    out = torch.zeros(B, S, dtype=torch.float32, device=input_ids.device)
    if not parts:
        return out
    return out.index_copy(0, torch.tensor(order, device=input_ids.device), torch.cat(parts))
