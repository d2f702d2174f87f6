"""The Python sandbox: bubblewrap + seccomp + rlimits, one fresh REPL process per episode, warm pool.

See ``docs/tools.md`` for the threat model. Public entry points: :class:`SandboxConfig`,
:class:`SandboxPool`, :class:`Sandbox`.
"""

from gym_llm.tools.sandbox.config import SandboxConfig
from gym_llm.tools.sandbox.pool import SandboxPool
from gym_llm.tools.sandbox.process import ReplChannel, ReplReply, Sandbox, SandboxError, SandboxUnavailableError

__all__ = ["ReplChannel", "ReplReply", "Sandbox", "SandboxConfig", "SandboxError", "SandboxPool",
           "SandboxUnavailableError"]
