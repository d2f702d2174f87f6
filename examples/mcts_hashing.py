"""Monte-Carlo tree search over a language model's tokens, with LLMHashing-v0's hashes as node ids.

    PYTHONPATH=.:adapters python examples/mcts_hashing.py --num-simulations 200 --target fox

The tree is a dict ``hash -> Node``. A node's children need no env step to be looked up: the child
reached by token ``t`` is ``H(node.hash, t)`` (:func:`gym_llm.envs.hashing.chain_hash.chain_hash` with the
parent hash as seed), so the env is stepped only to *create* a node — from the parent's snapshot
(``env.set_state``), after which the child's snapshot is kept (``env.get_state``).

Search: PUCT (Silver et al., 2017, "Mastering the game of Go without human knowledge")::

    a* = argmax_a  Q(s, a) + c_puct * P(a | s) * sqrt(N(s)) / (1 + N(s, a))

with priors ``P`` from the model's next-token distribution (temperature ``--temperature``), values
from one sampled rollout to the episode's end, and the env's terminal reward: the longest prefix of
``--target`` found in the generated text, as a fraction of its length. The model is the tiny random
Qwen2 checkpoint of ``gym_llm_adapters.models.tiny`` (any causal LM directory works: ``--model-dir``).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field

import numpy as np

from gym_llm.envs.hashing.chain_hash import chain_hash
from gym_llm.envs.hashing import HashingState, LLMHashingEnv


@dataclass
class Args:
    model_dir: str | None = None
    """a causal LM folder (transformers); default: the tiny random checkpoint (built once, offline)"""
    prompt: str = "The quick brown"
    """the prompt the search continues"""
    target: str = "fox"
    """reward = longest prefix of this string found in the continuation / its length"""
    num_simulations: int = 100
    """selection-expansion-rollout-backup rounds"""
    max_new_tokens: int = 8
    """episode length (tokens generated after the prompt)"""
    c_puct: float = 1.5
    """exploration weight of the prior term"""
    temperature: float = 1.0
    """softmax temperature of the priors and rollouts"""
    seed: int = 0
    """rollout sampling seed"""


@dataclass
class Node:
    state: HashingState
    priors: np.ndarray | None = None  # (V,) next-token probabilities; None until expanded
    visits: np.ndarray | None = None  # (V,) N(s, a)
    value_sum: np.ndarray | None = None  # (V,) total value through each child
    terminal: bool = False
    reward: float = 0.0
    children: dict[int, int] = field(default_factory=dict)  # token -> child hash


def target_reward(target: str, tokenizer):
    """The env's terminal reward: the longest prefix of ``target`` in the generated text, / len(target)."""

    def reward_fn(task, token_ids: np.ndarray, prompt_length: int) -> float:
        generated = tokenizer.decode(token_ids[prompt_length:].tolist())
        best = max(k for k in range(len(target) + 1) if target[:k] in generated)
        return best / len(target)

    return reward_fn


class Policy:
    """Next-token distributions from a transformers causal LM (one forward pass per call)."""

    def __init__(self, model_dir: str, temperature: float):
        import torch
        from transformers import AutoModelForCausalLM

        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.temperature = temperature

    def probs(self, token_ids: np.ndarray) -> np.ndarray:
        with self.torch.no_grad():
            logits = self.model(self.torch.tensor(token_ids)[None]).logits[0, -1]  # (V_model,)
        p = self.torch.softmax(logits / self.temperature, -1).double().numpy()
        return p / p.sum()


def search(args: Args, env: LLMHashingEnv, policy: Policy, rng: np.random.Generator) -> tuple[dict, int]:
    env.reset(seed=args.seed)
    root = env.get_state()
    tree = {root.hash: Node(root)}
    vocab = env.action_space.n
    for _ in range(args.num_simulations):
        path: list[tuple[int, int]] = []  # (node hash, token)
        node = tree[root.hash]
        while node.priors is not None and not node.terminal:  # selection
            n = node.visits
            q = np.divide(node.value_sum, n, out=np.zeros(vocab), where=n > 0)
            score = q + args.c_puct * node.priors * math.sqrt(n.sum() + 1) / (1 + n)
            token = int(np.argmax(score))
            path.append((node.state.hash, token))
            child_hash = chain_hash([token], seed=node.state.hash)  # the child's id, without stepping
            if child_hash not in tree:  # create it: branch the env from the parent's snapshot
                env.set_state(node.state)
                _, reward, terminated, truncated, _ = env.step(token)
                tree[child_hash] = Node(env.get_state(), terminal=terminated or truncated, reward=reward)
                node.children[token] = child_hash
            node = tree[child_hash]
        if node.terminal:
            value = node.reward
        else:  # expansion + one sampled rollout to the end of the episode
            node.priors = policy.probs(node.state.token_ids)[:vocab]
            node.priors /= node.priors.sum()
            node.visits, node.value_sum = np.zeros(vocab), np.zeros(vocab)
            env.set_state(node.state)
            ids, done, value = node.state.token_ids, False, 0.0
            while not done:
                p = policy.probs(ids)[:vocab]
                token = int(rng.choice(vocab, p=p / p.sum()))
                obs, value, terminated, truncated, _ = env.step(token)
                ids, done = obs["input_ids"][obs["attention_mask"] == 1], terminated or truncated
        for parent_hash, token in path:  # backup
            parent = tree[parent_hash]
            parent.visits[token] += 1
            parent.value_sum[token] += value
    return tree, root.hash


def best_leaf(tree: dict, root_hash: int) -> Node:
    """Follow the most visited children from the root to a leaf."""
    node = tree[root_hash]
    while node.visits is not None and node.visits.sum() > 0:
        node = tree[node.children[int(np.argmax(node.visits))]]
    return node


def main(args: Args) -> dict:
    from gym_llm_adapters.models.tiny import tiny_model_dir
    from transformers import AutoTokenizer

    model_dir = args.model_dir or str(tiny_model_dir())
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    env = LLMHashingEnv(prompts=[args.prompt], tokenizer=tokenizer, max_new_tokens=args.max_new_tokens,
                        max_seq_len=64 + args.max_new_tokens, reward_fn=target_reward(args.target, tokenizer))
    policy = Policy(model_dir, args.temperature)
    tree, root_hash = search(args, env, policy, np.random.default_rng(args.seed))
    leaf = best_leaf(tree, root_hash)
    prompt_len = leaf.state.prompt_length
    text = tokenizer.decode(leaf.state.token_ids[prompt_len:].tolist())
    rewards = [node.reward for node in tree.values() if node.terminal]
    result = {"nodes": len(tree), "best_path_text": text, "best_path_reward": leaf.reward,
              "best_terminal_reward_seen": max(rewards, default=0.0), "terminal_nodes": len(rewards)}
    print(f"prompt {args.prompt!r} -> {text!r}  reward {leaf.reward:.2f} (target {args.target!r}); "
          f"{len(tree)} nodes, {len(rewards)} terminal, best terminal reward seen {result['best_terminal_reward_seen']:.2f}")
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, value in vars(Args()).items():
        parser.add_argument("--" + name.replace("_", "-"), type=type(value) if value is not None else str, default=value)
    main(Args(**vars(parser.parse_args())))
