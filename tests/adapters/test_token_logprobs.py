"""token_logprobs against the model's own full-vocabulary log-softmax, values and gradients."""

from __future__ import annotations

import pytest
import torch

from gym_llm_adapters.logprobs import _LinearTokenLogProb, _plan_forwards, token_logprobs


@pytest.fixture(scope="module")
def model():
    from transformers import AutoModelForCausalLM

    from gym_llm_adapters.models.tiny import tiny_model_dir

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir(), dtype=torch.float32).eval()


def naive(model, input_ids, attention_mask, score_mask, temperature=1.0):
    """Full (B, S, V) log-softmax of the model's own logits, gathered at the next tokens."""
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
    logp = (logits[:, :-1] / temperature).log_softmax(-1).gather(2, input_ids[:, 1:, None]).squeeze(-1)
    return torch.cat([torch.zeros_like(logp[:, :1]), logp], 1) * score_mask


def right_padded_batch(seed=0, B=3, S=12):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 500, (B, S), generator=g)
    lengths = [S, S - 4, S - 2]
    attention = torch.zeros(B, S, dtype=torch.long)
    score = torch.zeros(B, S, dtype=torch.long)
    for b, n in enumerate(lengths):
        attention[b, :n] = 1
        score[b, 3:n] = 1
        ids[b, n:] = 0
    score[0, 6:8] = 0  # a tool turn inside the first episode: not scored
    return ids, attention, score


@pytest.mark.parametrize("chunk_bytes", [512 * 4 * 3, 1 << 30], ids=["3-row-chunks", "one-chunk"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_matches_full_log_softmax(model, chunk_bytes, temperature) -> None:
    ids, attention, score = right_padded_batch()
    with torch.no_grad():
        got = token_logprobs(model, ids, attention, score, temperature=temperature, chunk_bytes=chunk_bytes)
        want = naive(model, ids, attention, score, temperature)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert (got[score == 0] == 0).all() and (got[score == 1] < 0).all()


def test_padding_side_and_micro_batches_do_not_change_values(model) -> None:
    ids, attention, score = right_padded_batch(seed=1)
    with torch.inference_mode():
        right = token_logprobs(model, ids, attention, score)
        micro = token_logprobs(model, ids, attention, score, micro_batch_size=2)
        bucketed = token_logprobs(model, ids, attention, score, max_tokens_per_forward=20)
        # The same episodes, left-padded: roll each row so the padding comes first.
        shifts = [int(k) for k in (attention == 0).sum(1)]
        left_ids, left_attn, left_score = (torch.stack([torch.roll(row, k, 0) for row, k in zip(t, shifts)])
                                           for t in (ids, attention, score))
        left_out = token_logprobs(model, left_ids, left_attn, left_score)
    assert left_attn[1, 0] == 0  # really left-padded
    torch.testing.assert_close(micro, right, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(bucketed, right, rtol=1e-5, atol=1e-5)
    unrolled = torch.stack([torch.roll(row, -k, 0) for row, k in zip(left_out, shifts)])
    torch.testing.assert_close(unrolled, right, rtol=1e-5, atol=1e-5)


def test_plan_trims_each_forward_to_its_rows() -> None:
    attention = torch.zeros(5, 10, dtype=torch.long)
    for row, (lo, hi) in enumerate([(0, 10), (0, 3), (0, 9), (4, 10), (0, 0)]):
        attention[row, lo:hi] = 1
    plan = _plan_forwards(attention, None, 20)
    assert plan == [([0, 2], 0, 10), ([3, 1], 0, 10)]  # rows 3 (left-padded) and 1 span columns 0-10
    assert _plan_forwards(attention, 1, None) == [([0], 0, 10), ([2], 0, 9), ([3], 4, 10), ([1], 0, 3)]
    assert _plan_forwards(attention, None, None) == [([0, 2, 3, 1], 0, 10)]  # the empty row 4 is skipped


@pytest.mark.parametrize("limits", [{}, {"max_tokens_per_forward": 24}], ids=["one-forward", "bucketed"])
def test_gradients_match_autograd_through_full_logits(model, limits) -> None:
    ids, attention, score = right_padded_batch(seed=2)
    weights = torch.randn(ids.shape, generator=torch.Generator().manual_seed(0))
    model.zero_grad()
    logprobs = token_logprobs(model, ids, attention, score, temperature=0.8, chunk_bytes=512 * 4 * 5, **limits)
    (logprobs * weights).sum().backward()
    ours = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    (naive(model, ids, attention, score, 0.8) * weights).sum().backward()
    for name, param in model.named_parameters():
        scale = float(param.grad.abs().max())
        torch.testing.assert_close(ours[name], param.grad, rtol=1e-4, atol=1e-4 * scale)
    model.zero_grad()


def test_chunked_function_gradcheck_with_bias() -> None:
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(5, 4, dtype=torch.float64, generator=g, requires_grad=True)
    weight = torch.randn(7, 4, dtype=torch.float64, generator=g, requires_grad=True)
    bias = torch.randn(7, dtype=torch.float64, generator=g, requires_grad=True)
    targets = torch.tensor([0, 6, 3, 3, 1])

    def f(h, w, b):
        return _LinearTokenLogProb.apply(h, w, b, targets, 1 / 1.3, 2)

    # Float32 internals: compare to the float64 reference with a float32 tolerance.
    want = ((hidden @ weight.t() + bias) / 1.3).log_softmax(-1).gather(1, targets[:, None]).squeeze(1)
    torch.testing.assert_close(f(hidden, weight, bias).double(), want, rtol=1e-5, atol=1e-5)
    upstream = torch.randn(5, dtype=torch.float64, generator=g)
    grads = torch.autograd.grad((f(hidden, weight, bias) * upstream).sum(), (hidden, weight, bias))
    expected = torch.autograd.grad((want * upstream).sum(), (hidden, weight, bias))
    for got, exp in zip(grads, expected):
        torch.testing.assert_close(got.double(), exp, rtol=1e-4, atol=1e-5)


def test_softcapped_head_takes_the_exact_fallback() -> None:
    from transformers import Gemma2Config, Gemma2ForCausalLM

    config = Gemma2Config(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=16, final_logit_softcapping=5.0)
    torch.manual_seed(0)
    gemma = Gemma2ForCausalLM(config).eval()
    ids = torch.randint(0, 97, (2, 6))
    attention = torch.ones(2, 6, dtype=torch.long)
    score = torch.zeros(2, 6, dtype=torch.long)
    score[:, 2:] = 1
    with torch.no_grad():
        torch.testing.assert_close(token_logprobs(gemma, ids, attention, score), naive(gemma, ids, attention, score),
                                   rtol=1e-5, atol=1e-5)


def test_rejects_bad_masks(model) -> None:
    ids, attention, score = right_padded_batch()
    with pytest.raises(ValueError, match="first real token"):
        token_logprobs(model, ids, attention, attention.clone())
    with pytest.raises(ValueError, match="marks padding"):
        token_logprobs(model, ids, attention, torch.cat([score[:, :1], torch.ones_like(score[:, 1:])], 1))
    with pytest.raises(ValueError, match="score_mask must have input_ids' shape"):
        token_logprobs(model, ids, attention, score[:, :-1])
    left = torch.zeros_like(attention)
    left[:, 2:] = 1
    scored_first = torch.zeros_like(score)
    scored_first[:, 2] = 1
    with pytest.raises(ValueError, match="first real token"):
        token_logprobs(model, ids, left, scored_first)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        token_logprobs(model, ids, attention, score, temperature=0.0)


def grouped_batch(seed=3, S=30):
    """Two GRPO groups (4 and 3 rows sharing a prompt; one member left-padded, one with an unscored tool turn)
    and two rows that share nothing."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 500, (10, S), generator=g)
    attention = torch.zeros(10, S, dtype=torch.long)
    score = torch.zeros(10, S, dtype=torch.long)
    prompt_a, prompt_b = torch.randint(3, 500, (8,), generator=g), torch.randint(3, 500, (5,), generator=g)
    for row, n in enumerate([20, 25, 12, 30, 15, 9, 22, 18, 26]):
        attention[row, :n] = 1
        prompt = prompt_a if row < 4 else prompt_b if row < 7 else ids[row, :4]
        ids[row, : len(prompt)] = prompt
        score[row, len(prompt):n] = 1
        ids[row, n:] = 0
    score[0, 12:14] = 0  # a tool turn inside an episode: not scored
    ids[9] = 0  # the last row: prompt_a, left-padded, a 6-token completion
    ids[9, S - 14:S - 6] = prompt_a
    ids[9, S - 6:] = torch.randint(3, 500, (6,), generator=g)
    attention[9, S - 14:] = 1
    score[9, S - 6:] = 1
    return ids, attention, score


def test_prefix_groups_find_rows_with_the_same_context() -> None:
    from gym_llm_adapters.logprobs import _prefix_groups

    groups = _prefix_groups(*grouped_batch())
    assert sorted(sorted(r for r, *_ in group) for group in groups) == [[0, 1, 2, 3, 9], [4, 5, 6]]
    row9 = next(row for group in groups for row in group if row[0] == 9)
    assert row9 == (9, 16, 24, 30)  # (row, start, first scored column, end)


@pytest.mark.parametrize("kwargs", [{}, {"temperature": 0.7, "top_p": 0.9}, {"max_tokens_per_forward": 40},
                                    {"micro_batch_size": 2}], ids=["plain", "top-p", "bucketed", "micro"])
def test_shared_prefix_gives_the_same_values_and_gradients(model, kwargs) -> None:
    ids, attention, score = grouped_batch()
    weights = torch.randn(ids.shape, generator=torch.Generator().manual_seed(1))
    results = []
    for share in (False, True):
        model.zero_grad()
        out = token_logprobs(model, ids, attention, score, share_prefix=share, **kwargs)
        (out * weights).sum().backward()
        results.append((out.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    model.zero_grad()
    (plain, plain_grads), (shared, shared_grads) = results
    torch.testing.assert_close(shared, plain, rtol=1e-5, atol=1e-5)
    assert ((shared != 0) == score.bool()).all()
    for name, grad in plain_grads.items():
        torch.testing.assert_close(shared_grads[name], grad, rtol=1e-4, atol=1e-4 * float(grad.abs().max()))


def test_shared_prefix_runs_each_prompt_once(model) -> None:
    ids, attention, score = grouped_batch()

    def backbone_tokens(**kwargs):
        seen = []
        hook = model.base_model.register_forward_hook(
            lambda m, args, kw, out: seen.append(kw["input_ids"].numel()), with_kwargs=True)
        try:
            with torch.no_grad():
                token_logprobs(model, ids, attention, score, **kwargs)
        finally:
            hook.remove()
        return seen

    seen = backbone_tokens(share_prefix=True)
    # The two prompts once, in one forward (8 and 5 tokens, left-padded to 8); then all completions, longest first,
    # a new forward where one is under half the forward's longest: 22, 17, 17, 12 | 10, 6 | 4, 4 tokens; the two
    # rows that share nothing (18 and 26 tokens) take one ordinary forward.
    assert sorted(seen) == sorted([2 * 8, 4 * 22, 2 * 10, 2 * 4, 2 * 26])
    assert backbone_tokens() == [ids.numel()]  # the ordinary path: one forward over the padded batch


def test_shared_prefix_falls_back_for_sliding_window_models() -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from gym_llm_adapters.logprobs import _prefix_cache_ok

    config = Qwen2Config(vocab_size=500, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, use_sliding_window=True, sliding_window=4,
                         max_window_layers=0)
    torch.manual_seed(0)
    sliding = Qwen2ForCausalLM(config).eval()
    assert not _prefix_cache_ok(sliding)
    ids, attention, score = grouped_batch()
    with torch.no_grad():
        torch.testing.assert_close(token_logprobs(sliding, ids, attention, score, share_prefix=True),
                                   token_logprobs(sliding, ids, attention, score), rtol=0, atol=0)
