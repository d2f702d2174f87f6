"""Constructor arguments for every registered env id, in text and tokens modes.

Every test that must cover "every env" iterates over :func:`env_cases`; ``test_every_id_has_a_case``
fails when an env id is registered without a case here.
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

# id -> {case name: factory of kwargs}
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
    "LLMTokens-v0": {
        "text": lambda: {"mode": "text", "max_chars": 512},
        "tokens": lambda: {"tokenizer": _tiny_tok(), **SMALL_TOKENS, "max_steps": 4},
        "ids-only": lambda: {"vocab_size": 50, "prompts": [[1, 2, 3], [4]], "eos_token_ids": [0], "max_seq_len": 32,
                             "max_action_tokens": 8},
    },
}


def env_cases() -> list[tuple[str, str]]:
    return [(env_id, name) for env_id, cases in CASES.items() for name in cases]


def make_kwargs(env_id: str, name: str) -> dict[str, Any]:
    return CASES[env_id][name]()
