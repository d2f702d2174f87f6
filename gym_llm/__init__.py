"""gym-llm: Gymnasium environments for LLM post-training.

``import gym_llm`` registers every env id with Gymnasium — its own and those other packages declare in the
``gym_llm.envs`` entry-point group — and imports no torch, transformers or vllm::

    import gymnasium as gym, gym_llm
    env = gym.make("LLMChat-v0")
    envs = gym.make_vec("LLMGSM8K-v0", num_envs=8, group_size=4, data_files="test.jsonl")
"""

from gym_llm.core.messages import Message
from gym_llm.core.spaces import UnicodeText, pack_tokens, token_space, unpack_tokens
from gym_llm.core.tasks import Task
from gym_llm.registration import ENVS, load_plugin_envs, register_envs

__version__ = "0.1.0"
__all__ = ["ENVS", "Message", "Task", "UnicodeText", "pack_tokens", "token_space", "unpack_tokens", "__version__"]

register_envs()
load_plugin_envs()  # other packages' envs (the gym_llm.envs entry points): after gym-llm's own, which they may use
