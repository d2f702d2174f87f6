"""``python -m gym_llm_adapters.engines.serve_main ARGS``: vLLM's OpenAI-compatible API server (``vllm serve``'s
``python -m vllm.entrypoints.openai.api_server ARGS``, same arguments) with :func:`cpu_paths.apply` run first.

:class:`~gym_llm_adapters.engines.server_process.VLLMServer` starts servers this way, so a server gets what the
package's in-process engines get: a forced CPU path (``GYM_LLM_CPU_ISA``, ``GYM_LLM_VLLM_GEMM``;
``scripts/ci_matrix.sh`` runs the suite under each) and the sampler helper run eagerly on CPU (no inductor C++
build at the first request that asks for log-probs), and KV-cache blocks of 32 tokens on CPU unless ``--block-size``
is given (:func:`with_cpu_defaults`). The API server starts its engine core as a separate process;
a spawned one re-imports ``__main__``, which stays this module (imported there as ``__mp_main__``, it applies them
too), and a forked one inherits them. Each process prints one line to stderr naming the paths in effect.
"""

from __future__ import annotations

import runpy
import sys

API_SERVER = "vllm.entrypoints.openai.api_server"


def apply_cpu_paths() -> None:
    from gym_llm_adapters.engines import cpu_paths

    cpu_paths.apply()
    print(f"gym-llm CPU paths applied: {cpu_paths.describe()}; GEMM backend {cpu_paths.forced_gemm()}",
          file=sys.stderr, flush=True)


def with_cpu_defaults(argv: list[str], *, cpu: bool) -> list[str]:
    """The server's arguments with the package's CPU defaults added where the caller gave none: ``--block-size``
    :data:`cpu_paths.CPU_BLOCK_SIZE` on vLLM's CPU platform (what :func:`cpu_paths.llm_defaults` gives engines).

    >>> with_cpu_defaults(["--model", "m"], cpu=True), with_cpu_defaults(["--block-size=128"], cpu=True)
    (['--model', 'm', '--block-size', '32'], ['--block-size=128'])
    """
    from gym_llm_adapters.engines import cpu_paths

    if any(a == "--block-size" or a.startswith("--block-size=") for a in argv):
        return list(argv)
    block = cpu_paths.llm_defaults({}, cpu=cpu).get("block_size")
    return list(argv) + ([] if block is None else ["--block-size", str(block)])


def main() -> None:
    apply_cpu_paths()
    from vllm.platforms import current_platform

    sys.argv[1:] = with_cpu_defaults(sys.argv[1:], cpu=current_platform.is_cpu())
    sys.argv[0] = API_SERVER
    # alter_sys=False: ``sys.modules["__main__"]`` stays this module, so multiprocessing's spawned children (the
    # engine core) import it as ``__mp_main__`` and apply the same paths (below) before vLLM builds a model there.
    runpy.run_module(API_SERVER, run_name="__main__", alter_sys=False)


if __name__ == "__main__":
    main()
elif __name__ == "__mp_main__":  # a process vLLM spawned from the server (engine core, workers)
    apply_cpu_paths()
