"""Tokens mode keeps the sampled ids verbatim over many turns; the env only appends its own tokens."""

from __future__ import annotations

import numpy as np
import pytest

from gym_llm.core.spaces import unpack_tokens
from gym_llm.envs.chat import LLMChatEnv

# ChatML, but assistant turns before the last user message lose their <think>...</think> block —
# the history rewriting that Qwen3's template does. Rendering history again would change the tokens.
THINK_STRIPPING_TEMPLATE = """\
{%- set ns = namespace(last_user=-1) %}
{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}{%- endfor %}
{%- for m in messages %}
{%- set content = m.content %}
{%- if m.role == 'assistant' and loop.index0 < ns.last_user and '</think>' in content %}
{%- set content = content.split('</think>')[-1].lstrip('\\n') %}
{%- endif %}
{{- '<|im_start|>' + m.role + '\\n' + content + '<|im_end|>\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""

FOLLOW_UPS = ["Why?", "Give an example.", "Summarise in one word."]


def _sampled(tokenizer, text: str, *, close: bool = True, split_words: bool = False) -> list[int]:
    """Token ids as a sampler might produce them; ``split_words`` makes a non-canonical tokenisation
    (one id per character of the first word) that re-tokenising the text would not reproduce."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    if split_words:
        first, rest = text.split(" ", 1)
        ids = [t for ch in first for t in tokenizer.encode(ch, add_special_tokens=False)]
        ids += tokenizer.encode(" " + rest, add_special_tokens=False)
    if close:
        ids.append(tokenizer.eos_token_id)
    return ids


@pytest.mark.parametrize("template", [None, THINK_STRIPPING_TEMPLATE], ids=["tokenizer-template", "think-stripping"])
def test_multi_turn_sequence_is_prompt_plus_sampled_plus_env(qwen_tokenizer, template):
    tok = qwen_tokenizer
    assert tok.pad_token_id == tok.eos_token_id  # the case where padding cannot be inferred from ids
    env = LLMChatEnv(
        prompts=[{"prompt": "Is the sky blue?", "follow_ups": FOLLOW_UPS}],
        mode="tokens", tokenizer=tok, chat_template=template, system_prompt="Be brief.",
        max_turns=4, max_seq_len=512, max_action_tokens=64,
    )
    obs, info = env.reset(seed=0)
    sequence = unpack_tokens(obs).tolist()
    assert sequence == tok.encode(
        env.parts.extra["chat"].renderer.render(env.episode.messages, add_generation_prompt=True),
        add_special_tokens=False,
    )
    assert info["policy_mask"].sum() == 0
    replies = [
        _sampled(tok, "<think>It scatters light.</think>Yes, it is blue."),
        _sampled(tok, "Rayleigh scattering favours short wavelengths.", split_words=True),
        _sampled(tok, "<think>\nexample\n</think>\nA clear noon sky.", close=False),  # cut off: no eos
        _sampled(tok, "Scattering."),
    ]
    sampled_positions = []
    for turn, reply in enumerate(replies, start=1):
        before = list(sequence)
        obs, reward, terminated, truncated, info = env.step(np.array(reply))
        sequence = unpack_tokens(obs).tolist()
        # every earlier token, and the sampled ids right after them, are untouched
        assert sequence[: len(before)] == before
        assert sequence[len(before): len(before) + len(reply)] == reply
        sampled_positions.extend(range(len(before), len(before) + len(reply)))
        mask = info["policy_mask"][: len(sequence)]
        assert np.flatnonzero(mask).tolist() == sampled_positions
        env_tokens = sequence[len(before) + len(reply):]
        if turn < 4:
            text = tok.decode(env_tokens)
            assert FOLLOW_UPS[turn - 1] in text and text.endswith("<|im_start|>assistant\n")
            # the assistant turn is closed exactly once: by the policy's eos, or by the env if it was cut off
            closed_by_policy = reply[-1] == tok.eos_token_id
            assert text.startswith("\n<|im_start|>user" if closed_by_policy else "<|im_end|>\n<|im_start|>user")
            assert not (terminated or truncated)
        else:
            assert env_tokens == [] and terminated and not truncated
    # the think blocks sampled in turn 1 are still in the sequence, even with the stripping template
    assert tok.encode("<think>It scatters light.</think>", add_special_tokens=False)[0] in sequence
    full = tok.decode(sequence)
    assert "<think>It scatters light.</think>Yes, it is blue." in full


def test_policy_mask_and_messages_agree(tiny_tok):
    env = LLMChatEnv(prompts=[{"prompt": "hi", "follow_ups": ["more"]}], mode="tokens", tokenizer=tiny_tok,
                     max_turns=2, max_seq_len=256, max_action_tokens=32)
    obs, _ = env.reset(seed=1)
    reply = tiny_tok.encode("hello there", add_special_tokens=False) + [tiny_tok.eos_token_id]
    obs, _, _, _, info = env.step(reply)
    assert [m.role for m in env.episode.messages] == ["user", "assistant", "user"]
    assert env.episode.messages[1].content == "hello there"
    n = int(obs["attention_mask"].sum())
    assert info["policy_mask"][:n].sum() == len(reply)
    assert (info["policy_mask"][n:] == 0).all() and (obs["input_ids"][n:] == 0).all()


def test_truncates_when_the_env_turn_does_not_fit(tiny_tok):
    env = LLMChatEnv(prompts=[{"prompt": "hi", "follow_ups": ["x" * 400]}], mode="tokens", tokenizer=tiny_tok,
                     max_turns=3, max_seq_len=128, max_action_tokens=16)
    env.reset(seed=0)
    reply = tiny_tok.encode("ok", add_special_tokens=False) + [tiny_tok.eos_token_id]
    obs, _, terminated, truncated, info = env.step(reply)
    assert truncated and not terminated
    seq = unpack_tokens(obs).tolist()
    assert seq[-len(reply):] == reply  # the sampled ids are the last thing in the sequence


def test_handler_resources_are_released_when_the_episode_ends():
    """Per-episode resources (sandbox, browser context) go back as soon as the episode ends, once."""
    from gym_llm.core.chat import ChatConfig, ChatCommon, Response
    from gym_llm.core.tasks import tasks_from_records

    events = []

    class Handler:
        def start(self, episode):
            events.append(("start", episode.task.task_id))

        def respond(self, episode, reply):
            return Response(1.0, done=episode.turn >= 1)

        def close(self, episode):
            events.append(("close", episode.task.task_id))

    core = ChatCommon(ChatConfig(max_turns=3), Handler())
    episode = core.new_episode()
    task = tasks_from_records(["hi"])[0]
    episode.start(task)
    for _ in range(2):
        checked = episode.check_action("x")
        t = episode.advance(checked, episode.respond(checked))
    assert t.terminated and events == [("start", 0), ("close", 0)]
    episode.start(task)
    episode.close()
    episode.close()
    assert events == [("start", 0), ("close", 0), ("start", 0), ("close", 0)]
