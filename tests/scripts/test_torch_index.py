"""scripts/torch_index.sh (sourced by scripts/setup.sh) picks torch's index: the CPU build from PyTorch's index on a
machine without a GPU when that index answers, the default index at once when it does not, the default index with a
GPU, the user's choice over all. Run with a fake ``python -m pip`` (records its arguments; every other use of python is
the real one, so the index probe is real) and a fake ``nvidia-smi``; the "PyTorch index" is a local HTTP server, or a
port nothing listens on, or an address that never answers."""

from __future__ import annotations

import http.server
import os
import shlex
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "torch_index.sh"

FAKE_PYTHON = """#!/bin/sh
if [ "$1" = -m ] && [ "$2" = pip ]; then
  shift 2
  echo "$*" >> "$FAKE_PIP_LOG"
  [ "$1" = config ] && [ -n "${FAKE_PIP_CONFIG:-}" ] && echo "$FAKE_PIP_CONFIG"
  exit "${FAKE_PIP_STATUS:-0}"
fi
exec {python} "$@"
"""


@pytest.fixture(scope="module")
def index_url():
    """A local stand-in for PyTorch's CPU index: answers ``/torch/``."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            self.send_response(200 if self.path == "/torch/" else 404)
            self.end_headers()
            self.wfile.write(b"<a href='torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl'>torch</a>")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"  # closed again: nothing listens there


def install(tmp_path: Path, *, gpu: bool, cpu_index: str, **env: str) -> tuple[list[str], str, float]:
    """Run ``install_torch`` as setup.sh does; returns the pip calls, stderr and the seconds it took."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    python = bin_dir / "python"
    python.write_text(FAKE_PYTHON.replace("{python}", shlex.quote(sys.executable)))
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-0)'\n" if gpu else
                   "#!/bin/sh\necho 'NVIDIA-SMI has failed because it couldn't communicate with the driver' >&2\n"
                   "exit 9\n")
    for path in (python, smi):
        path.chmod(0o755)
    log = tmp_path / "pip.log"
    log.write_text("")
    environ = {key: value for key, value in os.environ.items() if not key.startswith(("PIP_", "TORCH_"))}
    environ.update(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", FAKE_PIP_LOG=str(log),
                   TORCH_CPU_INDEX_URL=cpu_index, **env)
    start = time.monotonic()
    done = subprocess.run(["bash", "-c", f"set -euo pipefail; source {shlex.quote(str(SCRIPT))}; "
                                         f"install_torch {shlex.quote(str(python))} 2.13.0"],
                          env=environ, capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - start
    assert done.returncode == 0 or env.get("FAKE_PIP_STATUS"), done.stderr
    return log.read_text().splitlines(), done.stderr, elapsed


def installs(calls: list[str]) -> list[str]:
    return [call for call in calls if call.startswith("install")]


def test_no_gpu_and_the_cpu_index_answers_asks_for_the_cpu_build(tmp_path, index_url):
    calls, _, _ = install(tmp_path, gpu=False, cpu_index=index_url)
    assert installs(calls) == [f"install --quiet --index-url {index_url} torch==2.13.0"]


@pytest.mark.parametrize("where", ["closed port", "unresolvable host", "silent server"])
def test_no_gpu_and_the_cpu_index_unreachable_falls_back_to_the_default_index_quickly(tmp_path, where):
    with socket.socket() as silent:  # takes connections (the kernel's backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = {"closed port": closed_port_url(), "unresolvable host": "https://download.pytorch.invalid/whl/cpu",
               "silent server": f"http://127.0.0.1:{silent.getsockname()[1]}"}[where]
        calls, stderr, elapsed = install(tmp_path, gpu=False, cpu_index=url, TORCH_PROBE_TIMEOUT_S="2")
    assert installs(calls) == ["install --quiet torch==2.13.0"]
    assert f"{url} does not answer: torch from the default index" in stderr
    assert elapsed < 10, f"the fallback took {elapsed:.1f} s"
    if where == "silent server":
        assert elapsed >= 1.9  # the probe's timeout is what ended the wait


def test_a_gpu_gets_the_default_index(tmp_path, index_url):
    calls, stderr, _ = install(tmp_path, gpu=True, cpu_index=index_url)
    assert installs(calls) == ["install --quiet torch==2.13.0"] and "a GPU" in stderr


def test_the_user_s_own_index_is_kept(tmp_path, index_url):
    calls, _, _ = install(tmp_path, gpu=False, cpu_index=index_url, FAKE_PIP_CONFIG="global.index-url='https://mirror'")
    assert installs(calls) == ["install --quiet torch==2.13.0"]
    calls, _, _ = install(tmp_path, gpu=False, cpu_index=index_url, PIP_INDEX_URL="https://mirror/simple")
    assert installs(calls) == ["install --quiet torch==2.13.0"]
    calls, _, _ = install(tmp_path, gpu=False, cpu_index=index_url,  # an extra index is not the user's own
                          FAKE_PIP_CONFIG="global.extra-index-url='file:///opt/pypi/simple'")
    assert installs(calls) == [f"install --quiet --index-url {index_url} torch==2.13.0"]


def test_torch_index_url_overrides(tmp_path, index_url):
    calls, _, _ = install(tmp_path, gpu=True, cpu_index=index_url, TORCH_INDEX_URL="https://example.org/whl/cu130")
    assert installs(calls) == ["install --quiet --index-url https://example.org/whl/cu130 torch==2.13.0"]
    calls, _, _ = install(tmp_path, gpu=False, cpu_index=index_url, TORCH_INDEX_URL="default")
    assert installs(calls) == ["install --quiet torch==2.13.0"]


def test_a_failed_cpu_index_install_falls_back_unless_the_user_chose_the_index(tmp_path, index_url):
    calls, stderr, _ = install(tmp_path, gpu=False, cpu_index=index_url, FAKE_PIP_STATUS="1")
    assert installs(calls) == [f"install --quiet --index-url {index_url} torch==2.13.0",
                               "install --quiet torch==2.13.0"]
    assert "trying the default index" in stderr
    calls, _, _ = install(tmp_path, gpu=False, cpu_index=index_url, FAKE_PIP_STATUS="1", TORCH_INDEX_URL=index_url)
    assert installs(calls) == [f"install --quiet --index-url {index_url} torch==2.13.0"]


def test_setup_sh_sources_it_and_decides_vllm_with_it():
    text = (REPO / "scripts" / "setup.sh").read_text()
    assert "source scripts/torch_index.sh" in text and 'install_torch "$PY" "$TORCH_VERSION"' in text
    assert "if has_gpu; then VLLM=gpu" in text and 'pip install --quiet "torch==' not in text
