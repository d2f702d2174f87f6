"""The sandbox finds the host's interpreter and packages however the environment was reached, and says at once why
when it cannot.

Each layout runs a real host process (a fresh interpreter reached that way) that starts a sandbox and imports a
module inside it; the module must come from the same installed file the host would import. Layouts: a venv reached
through a symbolic link (a home or conda env on a linked disk; it once left the sandbox without the venv's
site-packages, so MLGym graded correct submissions as failed), a ``python -m venv --copies`` venv, and a system
interpreter with ``pip install --user`` packages. Not covered here: a conda env (no conda on these machines; its
layout is a prefix like a venv's, with site-packages under it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import textwrap
import time
from pathlib import Path

import pytest

from gym_llm.tools import SandboxConfig
from gym_llm.tools.sandbox.pool import SandboxPool
from gym_llm.tools.sandbox.process import Sandbox, SandboxError, SandboxUnavailableError, _sandbox_path

REPO = Path(__file__).resolve().parents[2]
PROBE = "gym_llm_layout_probe"

_REPORT = textwrap.dedent(f"""
    import json, sys
    from gym_llm.tools import PythonTool, ToolCall
    modules = sys.argv[1:]
    tool = PythonTool(timeout_s=30.0, min_idle=0)
    tool.attach()
    session = tool.open_session()
    code = "import importlib, json, sys\\n" + "print(json.dumps({{'executable': sys.executable, **{{m: importlib.import_module(m).__file__ for m in %r}}}}))" % (modules,)
    result = session.run(ToolCall("python", {{"code": code}}))
    session.close()
    tool.detach()
    host = {{m: __import__(m).__file__ for m in modules}}
    print(json.dumps({{"inside": result.content, "host": host, "host_executable": sys.executable}}))
""")


def _inside(report: str) -> dict:
    """The JSON line the sandboxed code printed (the tool result may add framing around it)."""
    lines = [line for line in report.splitlines() if line.startswith("{")]
    assert lines, f"the sandboxed code printed no report: {report!r}"
    return json.loads(lines[-1])


def _run_layout(python: str | Path, modules: list[str], env: dict[str, str] | None = None) -> dict:
    done = subprocess.run([str(python), "-c", _REPORT, *modules], capture_output=True, text=True, timeout=180,
                          cwd=REPO, env={**os.environ, **(env or {})})
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    return {"inside": _inside(report["inside"]), "host": report["host"], "host_executable": report["host_executable"]}


def _same_file(inside: str, host: str) -> bool:
    """The sandbox binds the host's resolved paths (``/tmp/...`` appears below ``/run/host``)."""
    return inside == _sandbox_path(os.path.realpath(host))


def _probe_module(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{PROBE}.py"
    path.write_text("VALUE = 42\n")
    return path


def _base_interpreter() -> str:
    """The interpreter the venv was made from (not a venv itself)."""
    return os.path.realpath(sys.executable)


def _host_deps_path() -> str:
    """What a non-venv interpreter needs on PYTHONPATH to import gym_llm and its dependencies from this venv."""
    return os.pathsep.join([str(REPO), sysconfig.get_paths()["purelib"]])


def test_a_venv_reached_through_a_symlink(tmp_path):
    link = tmp_path / "v"
    link.symlink_to(os.path.realpath(sys.prefix), target_is_directory=True)
    report = _run_layout(link / "bin" / "python", ["numpy", "gymnasium"])
    assert report["host_executable"].startswith(str(link))  # the host really ran through the link
    for module in ("numpy", "gymnasium"):
        assert _same_file(report["inside"][module], report["host"][module]), report


def test_a_venv_made_with_copies(tmp_path):
    venv = tmp_path / "copies"
    subprocess.run([_base_interpreter(), "-m", "venv", "--copies", "--without-pip", str(venv)], check=True,
                   timeout=120)
    site = Path(subprocess.check_output([str(venv / "bin" / "python"), "-c",
                                         "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True).strip())
    probe = _probe_module(site)
    report = _run_layout(venv / "bin" / "python", [PROBE], env={"PYTHONPATH": _host_deps_path()})
    assert not os.path.islink(venv / "bin" / "python")
    assert _same_file(report["inside"][PROBE], str(probe)), report


def test_a_system_interpreter_with_user_packages(tmp_path):
    if os.getuid() != os.geteuid():  # pragma: no cover - Python turns the user site off for setuid processes
        pytest.fail("run the suite with equal real and effective uids")
    user_base = tmp_path / "userbase"
    env = {"PYTHONUSERBASE": str(user_base), "PYTHONPATH": _host_deps_path()}
    user_site = subprocess.check_output([_base_interpreter(), "-c", "import site; print(site.getusersitepackages())"],
                                        text=True, env={**os.environ, **env}).strip()
    probe = _probe_module(Path(user_site))
    report = _run_layout(_base_interpreter(), [PROBE], env=env)
    assert _same_file(report["inside"][PROBE], str(probe)), report


def test_an_interpreter_that_is_gone_is_named_at_once(tmp_path, monkeypatch):
    dangling = tmp_path / "moved-venv" / "bin" / "python"
    dangling.parent.mkdir(parents=True)
    dangling.symlink_to(tmp_path / "no-such-python")
    monkeypatch.setattr(sys, "executable", str(dangling))
    _fails_at_once(SandboxConfig(), "no-such-python.*not an executable file")


def test_a_package_the_sandbox_cannot_see_is_named_at_once(tmp_path, monkeypatch):
    """The host imports the module from a folder outside every site dir (PYTHONPATH-style); preloading it in the
    sandbox fails there: an error naming the module and the fix, at once, not a 30 s wait or an ImportError in some
    episode."""
    _probe_module(tmp_path / "elsewhere")
    monkeypatch.syspath_prepend(str(tmp_path / "elsewhere"))
    _fails_at_once(SandboxConfig(preload=(PROBE,)), f"cannot import what this process can: {PROBE}.*extra_ro_paths")


def _fails_at_once(config: SandboxConfig, match: str) -> None:
    """Starting a sandbox raises at once; a pool (what every env uses) hands the reason to its first caller."""
    start = time.monotonic()
    with pytest.raises(SandboxUnavailableError, match=match):
        Sandbox.spawn(config)
    pool = SandboxPool(config, min_idle=0)
    try:
        with pytest.raises(SandboxError, match=match):
            pool.acquire()
    finally:
        pool.close()
    assert time.monotonic() - start < 10  # not the 30 s readiness wait


@pytest.mark.slow
def test_the_sandbox_suites_pass_from_a_symlinked_venv(tmp_path):
    """The sandbox-heavy test files, run by the venv's python reached through a link (``ln -s .venv /tmp/v``)."""
    link = tmp_path / "v"
    link.symlink_to(os.path.realpath(sys.prefix), target_is_directory=True)
    files = ["tests/tools/test_python_tool.py", "tests/envs/test_mlgym.py", "tests/envs/test_python_tool_env.py",
             "tests/tools/test_sandbox_layouts.py"]
    done = subprocess.run([str(link / "bin" / "python"), "-m", "pytest", *files, "-q", "-p", "no:cacheprovider",
                           "-m", "not slow", "-n", "2"], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-2000:]
    assert " passed" in done.stdout.splitlines()[-1] and "failed" not in done.stdout.splitlines()[-1]
