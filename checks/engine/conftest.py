"""The real-engine tier: a real vLLM 0.32 (CPU build) serving the hand-set model of build_model.py.

Two servers for the whole session, booted side by side (each ~100 s of one core):
- `spec`: ngram speculative decoding and both GLM parsers (glm45 reasoning, glm47 tools, auto tool choice);
- `plain`: no drafter and no parsers, chunks coalesced by `--stream-interval 8`. It is the one killed and
  restarted mid-soak.

vLLM comes from SPARKSTACK_VLLM_PYTHON (its own venv; never a sparkstack dependency; checks/vllm_venv.py): unset,
the tier skips, or fails where SPARKSTACK_REQUIRE_LAB is set (CI). Every module here that uses the servers marks itself
`xdist_group("vllm")`, which keeps them on one worker under `--dist loadgroup`. Should the group ever be split
again (pytest 9.2 dropped it silently: see the pin in python/pyproject.toml), the second worker to reach for the
servers fails at once, naming the first, instead of booting two more servers on a 2-core box.
"""

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

from vllm_server import NGRAM, Server  # noqa: E402
from vllm_venv import vllm_python  # noqa: E402

MODEL_NAME = "tiny"
SPEC_ARGS = ["--speculative-config", NGRAM, "--reasoning-parser", "glm45", "--tool-call-parser", "glm47",
             "--enable-auto-tool-choice"]


def pytest_configure(config):
    config.addinivalue_line("markers", "xdist_group(name): pytest-xdist runs a group's tests on one worker "
                                       "(with --dist loadgroup)")


@pytest.fixture(scope="session")
def vllm_py() -> str:
    return vllm_python()


@pytest.fixture(scope="session")
def tiny_model(vllm_py, tmp_path_factory) -> Path:
    """The hand-set model, built by the vLLM venv's transformers and tokenizers (no download)."""
    out = tmp_path_factory.mktemp("tiny-model")
    subprocess.run([vllm_py, str(HERE / "build_model.py"), str(out)], check=True, capture_output=True,
                   cwd=out, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    return out


@dataclass
class Engines:
    spec: Server
    plain: Server


def _claim_servers(tmp_path_factory) -> None:
    """Under xdist, the first worker to boot the servers writes its name where every worker of the run can see it."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        return
    claim = tmp_path_factory.getbasetemp().parent / "vllm-servers-worker"
    try:
        fd = os.open(claim, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        owner = claim.read_text().strip()
        if owner != worker:
            pytest.fail(f"the xdist group 'vllm' was split: {owner} already boots the servers, and {worker} was "
                        "given a test that needs them (run with --dist loadgroup, and a pytest that xdist's "
                        "loadgroup still works with)")
        return
    with os.fdopen(fd, "w") as f:
        f.write(worker)


@pytest.fixture(scope="session")
def engines(vllm_py, tiny_model, tmp_path_factory, request) -> Engines:
    _claim_servers(tmp_path_factory)
    servers = Engines(Server(vllm_py, tiny_model, MODEL_NAME, tmp_path_factory.mktemp("vllm-spec"), SPEC_ARGS),
                      Server(vllm_py, tiny_model, MODEL_NAME, tmp_path_factory.mktemp("vllm-plain"),
                             ["--stream-interval", "8"]))
    for s in (servers.spec, servers.plain):
        request.addfinalizer(s.stop)  # registered before the start: stopped even when a boot fails
        s.start()
    for s in (servers.spec, servers.plain):
        s.wait_healthy().warm()
    return servers


@pytest.fixture(scope="session")
def spec_server(engines) -> Server:
    return engines.spec


@pytest.fixture(scope="session")
def plain_server(engines) -> Server:
    return engines.plain
