"""examples/mcts_hashing.py runs end to end with tiny settings, and its tree is keyed by chain hashes."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from gym_llm.envs.hashing.chain_hash import chain_hash

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mcts_hashing.py"


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("mcts_hashing", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules["mcts_hashing"] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_mcts_example_smoke(example):
    args = example.Args(num_simulations=12, max_new_tokens=3, seed=1)
    result = example.main(args)
    assert result["nodes"] >= 4 and 0.0 <= result["best_path_reward"] <= 1.0
    assert result["best_terminal_reward_seen"] >= result["best_path_reward"] or result["terminal_nodes"] == 0


@pytest.mark.slow
def test_tree_nodes_are_keyed_by_chain_hash(example):
    from gym_llm_adapters.models.tiny import tiny_model_dir
    from transformers import AutoTokenizer

    from gym_llm.envs.hashing import LLMHashingEnv

    args = example.Args(num_simulations=10, max_new_tokens=3)
    model_dir = str(tiny_model_dir())
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    env = LLMHashingEnv(prompts=[args.prompt], tokenizer=tokenizer, max_new_tokens=3, max_seq_len=32,
                        reward_fn=example.target_reward(args.target, tokenizer))
    tree, root = example.search(args, env, example.Policy(model_dir, 1.0), np.random.default_rng(0))
    assert len(tree) > 3
    for key, node in tree.items():
        assert key == node.state.hash == chain_hash(node.state.token_ids)
        for token, child in node.children.items():
            ids = tree[child].state.token_ids
            assert ids[-1] == token and np.array_equal(ids[:-1], node.state.token_ids)
    assert all(len(n.state.token_ids) - n.state.prompt_length == 3 for n in tree.values() if n.terminal)
