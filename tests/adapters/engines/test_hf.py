"""The transformers engine: batched decoding, exact log-probs, sampling options, stops, weight loads."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gym_llm_adapters.engines import SamplingConfig

GREEDY = SamplingConfig(temperature=0.0, max_tokens=12)


@pytest.fixture(scope="module")
def prompts(tiny_tok):
    texts = ["hello", "What is 2 + 2? Think step by step.", "a"]
    return [tiny_tok.apply_chat_template([{"role": "user", "content": t}], tokenize=False, add_generation_prompt=True)
            for t in texts]


def _forward_logprobs(model, ids):
    """Naive reference: one forward of a single unpadded sequence."""
    with torch.no_grad():
        logits = model(torch.as_tensor(ids)[None]).logits[0].float()  # (S, V)
    logp = torch.log_softmax(logits[:-1], -1).gather(-1, torch.as_tensor(ids[1:])[:, None])[:, 0]
    return np.concatenate([[0.0], logp.numpy()]).astype(np.float32)


def test_left_padded_batch_equals_one_prompt_at_a_time(hf_engine, prompts):
    batch = hf_engine.generate(prompts, GREEDY)
    assert len({len(p) for p in prompts}) > 1  # the batch really is padded
    for prompt, together in zip(prompts, batch):
        alone, = hf_engine.generate([prompt], GREEDY)
        assert alone.token_ids.tolist() == together.token_ids.tolist()
        np.testing.assert_allclose(alone.logprobs, together.logprobs, atol=1e-5)


def test_sampled_logprobs_equal_a_plain_forward_on_the_sequence(hf_engine, prompts):
    sampling = SamplingConfig(max_tokens=10, seed=3, temperature=0.7)
    for c in hf_engine.generate(prompts, sampling):
        sequence = np.concatenate([c.prompt_ids, c.token_ids])
        reference = _forward_logprobs(hf_engine.model, sequence)
        assert len(c.logprobs) == len(c.token_ids) > 0
        np.testing.assert_allclose(c.logprobs, reference[len(c.prompt_ids):], atol=1e-5)  # raw: before temperature
        teacher, = hf_engine.logprobs([sequence])
        np.testing.assert_allclose(teacher, reference, atol=1e-5)
        assert teacher[0] == 0.0


def test_teacher_forcing_batches_ragged_sequences(fresh_hf_engine):
    engine = fresh_hf_engine
    engine.forward_token_budget = 40  # forces several forwards
    rng = np.random.default_rng(0)
    sequences = [rng.integers(0, 500, size=n) for n in (3, 17, 9, 30, 2)]
    for seq, got in zip(sequences, engine.logprobs(sequences)):
        np.testing.assert_allclose(got, _forward_logprobs(engine.model, seq), atol=1e-5)


def test_n_samples_are_prompt_major_reproducible_and_distinct(hf_engine, prompts):
    sampling = SamplingConfig(n=3, max_tokens=8, seed=11)
    first, again = hf_engine.generate(prompts, sampling), hf_engine.generate(prompts, sampling)
    assert len(first) == 9
    for i, c in enumerate(first):
        assert c.prompt_ids.tolist() == hf_engine.tokenizer.encode(prompts[i // 3], add_special_tokens=False)
    assert [c.token_ids.tolist() for c in first] == [c.token_ids.tolist() for c in again]
    assert len({tuple(c.token_ids.tolist()) for c in first}) > 3
    other = hf_engine.generate(prompts, SamplingConfig(n=3, max_tokens=8, seed=12))
    assert [c.token_ids.tolist() for c in other] != [c.token_ids.tolist() for c in first]


def test_text_and_token_prompts_are_the_same(hf_engine, prompts):
    ids = [hf_engine.tokenizer.encode(p, add_special_tokens=False) for p in prompts]
    by_text, by_ids = hf_engine.generate(prompts, GREEDY), hf_engine.generate(ids, GREEDY)
    assert [c.token_ids.tolist() for c in by_text] == [c.token_ids.tolist() for c in by_ids]


def test_max_tokens_stop_ids_and_stop_strings(hf_engine, prompts):
    long = hf_engine.generate([prompts[1]], SamplingConfig(temperature=0.0, max_tokens=16, ignore_eos=True))[0]
    assert long.finish_reason == "length" and len(long.token_ids) == 16
    ids = long.token_ids.tolist()
    # a stop id: generation ends on its first occurrence, the id kept
    stop_id = ids[5]
    first = ids.index(stop_id)
    by_id = hf_engine.generate([prompts[1]], SamplingConfig(temperature=0.0, max_tokens=16, stop_token_ids=(stop_id,)))[0]
    assert by_id.token_ids.tolist() == ids[: first + 1] and by_id.finish_reason == "stop"
    # a stop string: the ids end with the token that completed it; the text stops before it
    text = hf_engine.tokenizer.decode(ids, skip_special_tokens=True)
    stop = text[len(text) // 2: len(text) // 2 + 2]
    assert stop.strip()
    by_str = hf_engine.generate([prompts[1]], SamplingConfig(temperature=0.0, max_tokens=16, stop=(stop,)))[0]
    assert by_str.finish_reason == "stop" and by_str.text == text[: text.index(stop)]
    assert ids[: len(by_str.token_ids)] == by_str.token_ids.tolist()
    assert stop in hf_engine.tokenizer.decode(by_str.token_ids, skip_special_tokens=True)
    assert stop not in hf_engine.tokenizer.decode(by_str.token_ids[:-1], skip_special_tokens=True)
    kept = hf_engine.generate([prompts[1]], SamplingConfig(temperature=0.0, max_tokens=16, stop=(stop,),
                                                           include_stop_str_in_output=True))[0]
    assert kept.text == text[: text.index(stop) + len(stop)]


def test_eos_ends_generation_unless_ignored(fresh_hf_engine):
    engine = fresh_hf_engine
    eos = engine.tokenizer.eos_token_id
    greedy, = engine.generate([[5, 6, 7]], GREEDY)
    assert eos not in greedy.token_ids
    head = engine.model.lm_head.weight
    with torch.no_grad():  # eos now outscores the token greedy picked at step 3 (a positive max logit)
        head[eos] = 2.0 * head[int(greedy.token_ids[2])]
    out, = engine.generate([[5, 6, 7]], GREEDY)
    assert out.finish_reason == "stop" and out.token_ids[-1] == eos and eos not in out.token_ids[:-1]
    assert len(out.token_ids) <= 3 and out.text == engine.tokenizer.decode(out.token_ids[:-1])
    ignored, = engine.generate([[5, 6, 7]], SamplingConfig(temperature=0.0, max_tokens=12, ignore_eos=True))
    assert ignored.finish_reason == "length" and len(ignored.token_ids) == 12


def test_processed_logprobs_follow_the_sampling_distribution(tiny_model_path):
    from gym_llm_adapters.engines import HFEngine

    engine = HFEngine(tiny_model_path, logprobs_mode="processed")
    greedy, = engine.generate([[5, 6, 7]], GREEDY)
    top1, = engine.generate([[5, 6, 7]], SamplingConfig(max_tokens=12, top_k=1, seed=0))
    assert top1.token_ids.tolist() == greedy.token_ids.tolist()
    np.testing.assert_allclose(top1.logprobs, 0.0, atol=1e-6)  # only one token left to sample from
    assert (greedy.logprobs < 0).all()  # greedy's processed distribution is the raw one


def test_load_weights_bumps_the_version_and_refuses_bad_updates(fresh_hf_engine):
    engine = fresh_hf_engine
    before = engine.generate([[5, 6, 7]], GREEDY)[0]
    state = {k: v + 0.1 * torch.randn_like(v) for k, v in engine.model.state_dict().items()}
    assert engine.load_weights(state) == 1 and engine.version == 1
    after = engine.generate([[5, 6, 7]], GREEDY)[0]
    assert after.version == 1 and before.version == 0
    assert not np.allclose(before.logprobs[:1], after.logprobs[:1])
    with pytest.raises(ValueError, match="names the model does not have"):
        engine.load_weights({"nope": torch.zeros(1)})
    with pytest.raises(ValueError, match="has shape"):
        engine.load_weights({"lm_head.weight": torch.zeros(2, 2)})
    assert engine.version == 1


def test_bad_prompts_raise_clear_errors(hf_engine):
    with pytest.raises(TypeError, match="wrap a single prompt in a list"):
        hf_engine.generate("hello", GREEDY)
    with pytest.raises(ValueError, match="empty"):
        hf_engine.generate([[]], GREEDY)
    with pytest.raises(TypeError, match="1-D sequence of int"):
        hf_engine.generate([[[1, 2]]], GREEDY)
    with pytest.raises(TypeError, match="SamplingConfig"):
        hf_engine.generate([[1]], {"max_tokens": 3})
