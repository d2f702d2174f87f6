"""Constructor arguments for every registered env id, in text and tokens modes — driven by the registry.

Every test that must cover "every env" iterates over :func:`env_cases`, which walks ``gym_llm.ENVS``: an env id
gets :data:`DEFAULT_CASES` (``{}`` in text mode; the tiny tokenizer in tokens mode) unless :data:`CASES` overrides
it (data files, a smaller sequence, an env without a text mode). A new env that works with no arguments needs no
entry here.
"""

from __future__ import annotations

from typing import Any, Callable

from tests.conftest import shared_data_dir


def _tiny_tok():
    from gym_llm_adapters.models.tokenizers import tiny_tokenizer

    return tiny_tokenizer()


def _ifeval() -> dict[str, Any]:
    return {"data_files": str(shared_data_dir() / "ifeval" / "input_data.jsonl")}


def _gsm8k() -> dict[str, Any]:
    return {"data_files": str(shared_data_dir() / "gsm8k" / "test.jsonl")}


SMALL_TOKENS = {"max_seq_len": 256, "max_action_tokens": 24}

DEFAULT_CASES: dict[str, Callable[[], dict[str, Any]]] = {
    "text": lambda: {},
    "tokens": lambda: {"mode": "tokens", "tokenizer": _tiny_tok(), "max_seq_len": 1024, "max_action_tokens": 24},
}
"""The cases of an env id without an override: its defaults, in text and in tokens mode."""

# id -> {case name: factory of kwargs}: the envs whose defaults do not suit a test (or have no text mode)
CASES: dict[str, dict[str, Callable[[], dict[str, Any]]]] = {
    "LLMBrowser-v0": {
        "text": lambda: {},
        "tokens": lambda: {"mode": "tokens", "tokenizer": _tiny_tok(), "max_seq_len": 4096, "max_action_tokens": 24},
    },
    "LLMChat-v0": {
        "text": lambda: {},
        "tokens": lambda: {"mode": "tokens", "tokenizer": _tiny_tok(), **SMALL_TOKENS},
    },
    "LLMGSM8K-v0": {
        "text": _gsm8k,
        "tokens": lambda: {**_gsm8k(), "mode": "tokens", "tokenizer": _tiny_tok(), "max_seq_len": 1024,
                           "max_action_tokens": 24},
    },
    "LLMIFEval-v0": {
        "text": _ifeval,
        "tokens": lambda: {**_ifeval(), "mode": "tokens", "tokenizer": _tiny_tok(), "max_seq_len": 4096,
                           "max_action_tokens": 24},
    },
    "LLMHashing-v0": {
        "tokens": lambda: {"tokenizer": _tiny_tok(), "max_seq_len": 64, "max_new_tokens": 6},
        "text-output": lambda: {"tokenizer": _tiny_tok(), "max_seq_len": 64, "text_output": True},
        "ids-only": lambda: {"vocab_size": 50, "prompts": [[1, 2, 3], [4]], "eos_token_ids": [0], "max_seq_len": 16},
    },
    "LLMPythonTool-v0": {
        "text": lambda: {**_gsm8k(), "sandbox": {"min_idle": 0}},
        "tokens": lambda: {**_gsm8k(), "mode": "tokens", "tokenizer": _tiny_tok(), "max_seq_len": 2048,
                           "max_action_tokens": 24, "sandbox": {"min_idle": 0}},
    },
    "LLMCode-v0": {  # HumanEval's longest prompt is 1,079 tokens of the tiny tokenizer (task 129)
        "text": lambda: {},
        "tokens": lambda: {"mode": "tokens", "tokenizer": _tiny_tok(), "max_seq_len": 2048, "max_action_tokens": 24},
    },
    "LLMTokens-v0": {
        "text": lambda: {"mode": "text", "max_chars": 512},
        "tokens": lambda: {"tokenizer": _tiny_tok(), **SMALL_TOKENS, "max_steps": 4},
        "ids-only": lambda: {"vocab_size": 50, "prompts": [[1, 2, 3], [4]], "eos_token_ids": [0], "max_seq_len": 32,
                             "max_action_tokens": 8},
    },
}


def cases_of(env_id: str) -> dict[str, Callable[[], dict[str, Any]]]:
    return CASES.get(env_id, DEFAULT_CASES)


def env_cases() -> list[tuple[str, str]]:
    import gym_llm

    return [(info.id, name) for info in gym_llm.ENVS for name in cases_of(info.id)]


def make_kwargs(env_id: str, name: str) -> dict[str, Any]:
    return cases_of(env_id)[name]()
