import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import settings

# Property tests: a developer's run explores fresh examples each time (and remembers failures in .hypothesis/);
# CI selects "ci" (.ci/run sets SPARKSTACK_HYPOTHESIS_PROFILE=ci; checks/unit/test_ci.py holds it to that) so one commit gets one verdict: the examples
# follow from each test alone (derandomize), no example database carries over, no deadline (a loaded machine
# is slow, not wrong). The example counts are each test's own @settings, the same under both profiles.
settings.register_profile("ci", derandomize=True, database=None, deadline=None, print_blob=True)
settings.register_profile("dev", deadline=None, print_blob=True)
settings.load_profile(os.environ.get("SPARKSTACK_HYPOTHESIS_PROFILE", "dev"))

CHECKS = Path(__file__).parent
sys.path.insert(0, str(CHECKS))


from clirun import PLANNED, assert_planned, run_in_process, sparkstack_cmd  # noqa: E402

# xdist groups whose tests wait for something .ci/run makes beside them, and the variable naming the file that says
# it is made (whole, `ok` or the failure). Until then the group is handed out after the other work, so no worker
# sits waiting while tests are left; once it exists, the group goes next. Unset (a developer's run): no waiting.
READY_FILES = {"vllm": "SPARKSTACK_VLLM_READY", "realpair": "SPARKSTACK_VLLM_BASE_READY"}


def _made(group: str) -> bool:
    path = os.environ.get(READY_FILES[group])
    return not path or os.path.exists(path)


@pytest.hookimpl(optionalhook=True)  # a run without xdist (`-p no:xdist`, a child pytest) knows no such hook
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadgroup`, with the groups of READY_FILES handed out when what they wait for is made (the order
    changes only when tests run, never which tests run or what they see)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class WhenMade(LoadGroupScheduling):
        def _assign_work_unit(self, node) -> None:
            for scope in [s for s in self.workqueue if s in READY_FILES]:
                self.workqueue.move_to_end(scope, last=not _made(scope))
            super()._assign_work_unit(node)

    return WhenMade(config, log)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """With SPARKSTACK_TEST_TIMELINE=FILE (.ci/run sets it), each test's worker, start and end (epoch seconds) go to
    FILE, one line each: CI's report then shows what each worker did when (checks/slowest.py). Only an xdist
    worker writes: a pytest a test runs inside (it inherits the variable) would count its tests twice."""
    path = os.environ.get("SPARKSTACK_TEST_TIMELINE")
    began = time.time()
    yield
    if path and hasattr(item.config, "workerinput"):
        worker = item.config.workerinput["workerid"]
        with open(path, "a") as f:  # one short write per line: the workers' lines do not interleave
            f.write(f"{worker}\t{began:.3f}\t{time.time():.3f}\t{item.nodeid}\n")


def _checked(proc, check):
    """`check`: PLANNED (a dry run's verdict), an exit code, or None (anything)."""
    if check == PLANNED:
        assert_planned(proc)
    elif check is not None:
        assert proc.returncode == check, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc


@pytest.fixture
def run_cli():
    """Run the real CLI in a subprocess, as a user would."""

    def run(*args, env=None, check=None):
        full_env = dict(os.environ, **(env or {}))
        proc = subprocess.run(sparkstack_cmd() + [str(a) for a in args], capture_output=True, text=True, env=full_env)
        return _checked(proc, check)

    return run


@pytest.fixture
def run_inproc():
    """`run_cli`, but the real entry point called in this process (clirun.run_in_process): for refusals checked
    by the dozen, where a child proves nothing more."""

    def run(*args, env=None, check=None):
        return _checked(run_in_process(args, env), check)

    return run


# The worlds that several test files stand on. A test file with a world of its own names it after what it holds
# (`ship_world`, `hostile_ship_world`, `untuned_host`, ...): checks/README.md lists them.

@pytest.fixture
def hub_world(tmp_path):
    """The hub stand-in serving the synthetic model and drafter (hub_standin.synthetic_repos), an empty HF_HOME,
    and `pinned`: each repo's current commit, as a pinned recipe names it. The hub is stopped afterwards."""
    from hub_standin import DRAFTER, MODEL, HubStandin, synthetic_repos

    repos = synthetic_repos(tmp_path / "repos")
    hub = HubStandin(repos).start()
    w = {"tmp": tmp_path, "repos": repos, "hub": hub, "hf": tmp_path / "hf",
         "pinned": {MODEL: repos[MODEL].refs["main"], DRAFTER: repos[DRAFTER].refs["main"]}}
    w["env"] = {"HF_ENDPOINT": hub.url, "HF_HOME": str(w["hf"]), "HF_TOKEN": "", "HF_HUB_OFFLINE": "",
                "HF_HUB_CACHE": "", "SPARKSTACK_RECIPES": ""}
    yield w
    hub.stop()


@pytest.fixture
def image_world(tmp_path, monkeypatch):
    """What `image build` takes, written by imagefix (not by sparkstack's writer): a base layout (`digests`: its
    manifest, config and layers), an overlay source and the overlay pinned from it; a private layer cache."""
    import imagefix as fx

    monkeypatch.setenv("SPARKSTACK_CACHE_DIR", str(tmp_path / "cache"))
    base = tmp_path / "base"
    digests = fx.write_base(base)
    src = fx.write_overlay_source(tmp_path / "src")
    overlay = fx.write_overlay(tmp_path / "overlay", pinned_from=src / "overlay-dflash2")
    return {"tmp": tmp_path, "base": base, "src": src, "overlay": overlay, "digests": digests}
