"""``scripts/setup.sh``, the front door: each command runs what the README and INSTRUCTORS.md promise,
and ``lab`` opens the repository root on START_HERE.ipynb, with lessons, exercises and solutions reachable.

The commands are read from a dry run (``FUSIONLAB_DRY_RUN=1`` prints the command, one argument a line,
without setting anything up); the lab's one is then started for real on loopback.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SETUP = ROOT / "scripts" / "setup.sh"
NBVAL = ["--nbval", "notebooks", "solutions", "--nbval-current-env", "--nbval-sanitize-with", "nbval_sanitize.cfg"]


def dry_run(*args: str) -> list[str]:
    env = {**os.environ, "FUSIONLAB_DRY_RUN": "1"}
    env.pop("FUSIONLAB_TEST_WORKERS", None)  # the default worker count
    out = subprocess.run(["bash", str(SETUP), *args], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def _has_run(argv: list[str], run: list[str]) -> bool:
    return any(argv[i : i + len(run)] == run for i in range(len(argv)))


def test_unknown_command_fails_fast_with_the_usage():
    start = time.monotonic()
    out = subprocess.run(["bash", str(SETUP), "tset"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2
    for cmd in ("lab", "test", "nbval", "record", "exercises"):
        assert cmd in out.stderr
    assert time.monotonic() - start < 5, "an unknown command must be refused before the (slow) set-up"


def test_no_command_sets_up_only():
    assert dry_run() == []


def test_test_runs_unit_tests_then_strict_nbval():
    argv = dry_run("test")
    assert argv[:4] == [".venv/bin/python", "-m", "pytest", "tests"]
    assert _has_run(argv, NBVAL)
    # in parallel (CI's 2 cores: 17.7 min in one process), each module and notebook in one worker
    assert _has_run(argv, ["-n", "auto", "--dist", "loadscope"])


def test_nbval_runs_strict_nbval_only_on_this_machine():
    argv = dry_run("nbval", "-x")
    assert argv[:3] == [".venv/bin/python", "-m", "pytest"] and "tests" not in argv
    assert _has_run(argv, NBVAL) and argv[-1] == "-x"  # extra arguments reach pytest


def test_record_and_exercises():
    assert dry_run("record", "--suites", "lesson1") == [
        ".venv/bin/python",
        "-m",
        "fusionlab.record",
        "--suites",
        "lesson1",
    ]
    assert dry_run("exercises", "--check") == [".venv/bin/python", "scripts/make_exercises.py", "--check"]
    assert (ROOT / "scripts" / "make_exercises.py").is_file()


def _torch_line(tmp_path: Path, gpu: bool | None, forced: str | None = None) -> str:
    """What the dry run says it would install for torch, with a stand-in ``nvidia-smi`` first on PATH that
    lists a GPU (``gpu=True``) or fails (``False``)."""
    bin_dir = tmp_path / f"bin-{gpu}"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\n" + ("echo 'GPU 0: NVIDIA H100'\n" if gpu else "exit 9\n"))
    (bin_dir / "nvidia-smi").chmod(0o755)
    env = {**os.environ, "FUSIONLAB_DRY_RUN": "1", "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    env.pop("FUSIONLAB_TORCH", None)
    if forced:
        env["FUSIONLAB_TORCH"] = forced
    out = subprocess.run(["bash", str(SETUP)], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return next(line for line in out.stderr.splitlines() if line.startswith("torch"))


@pytest.mark.skipif(sys.platform == "darwin", reason="macOS takes PyPI's torch, a CPU build, either way")
def test_without_a_gpu_torch_comes_from_the_cpu_index_and_with_one_from_pypi(tmp_path):
    cpu = "torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
    assert _torch_line(tmp_path, gpu=False).endswith(cpu)  # not gigabytes of CUDA wheels on a laptop
    assert _torch_line(tmp_path, gpu=True).endswith("pip install torch==2.13.0")
    assert _torch_line(tmp_path, gpu=True, forced="cpu").endswith(cpu)
    assert _torch_line(tmp_path, gpu=False, forced="cuda").endswith("pip install torch==2.13.0")
    bad = subprocess.run(
        ["bash", str(SETUP)], env={**os.environ, "FUSIONLAB_TORCH": "rocm"}, capture_output=True, text=True, timeout=30
    )
    assert bad.returncode == 2 and "FUSIONLAB_TORCH=rocm" in bad.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str):
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.status, r.read()


LANDING_URL = "--LabApp.default_url=/lab/tree/START_HERE.ipynb"


def _printed_urls(log: str) -> list[urllib.parse.ParseResult]:
    """The addresses the lab prints for a learner to open (with the token), as parsed URLs."""
    return [urllib.parse.urlparse(u) for u in re.findall(r"(http://127\.0\.0\.1:\d+/\S*\?token=\S+)", log)]


@pytest.mark.skipif(not (ROOT / ".venv" / "bin" / "jupyter").exists(), reason="needs .venv with JupyterLab")
def test_lab_prints_an_address_that_opens_the_landing_page(tmp_path):
    argv = dry_run("lab")
    assert argv[:2] == [".venv/bin/jupyter", "lab"] and LANDING_URL in argv
    assert f"--ServerApp.root_dir={ROOT}" in argv
    port = _free_port()
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "rt"), "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path)}
    # the token is the lab's own (one given on the command line is printed as "..."): the printed address carries it
    cmd = [*argv, "--no-browser", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}"]
    if "--allow-root" not in cmd:
        cmd.insert(2, "--allow-root")  # harmless when not root; the dry run adds it only as root
    log = tmp_path / "lab.log"
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while not _printed_urls(log.read_text()):
            assert proc.poll() is None, log.read_text()[-2000:]
            assert time.monotonic() < deadline, "JupyterLab printed no address in 60 s"
            time.sleep(0.5)
        # the address a learner copies from the terminal (not the redirect page a local browser gets)
        url = _printed_urls(log.read_text())[0]
        assert url.path == "/lab/tree/START_HERE.ipynb", url
        token = urllib.parse.parse_qs(url.query)["token"][0]
        status, page = _get(url.geturl())
        # the lab's page for that address opens START_HERE.ipynb: its page config names it as the tree path
        config = json.loads(re.search(rb'id="jupyter-config-data"[^>]*>(.*?)</script>', page, re.S).group(1))
        assert status == 200 and config.get("treePath") == "START_HERE.ipynb", config.get("treePath")
        top = {c["name"] for c in json.loads(_get(f"{base}/api/contents?token={token}")[1])["content"]}
        assert {"notebooks", "exercises", "solutions", "START_HERE.ipynb"} <= top
        for folder in ("notebooks", "exercises", "solutions"):
            for nb in sorted((ROOT / folder).glob("*.ipynb"))[:1]:
                status, _ = _get(f"{base}/api/contents/{folder}/{nb.name}?token={token}&content=0")
                assert status == 200, f"{folder}/{nb.name} is not reachable from the lab"
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
