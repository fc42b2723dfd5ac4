"""The shipped overlays/dflash2/overlay.toml says what the deployment applies (upstream's overlay-dflash2/ at a known
revision: three files, three of its patch scripts in order, the InstantTensor variant), and says it is unpinned."""

from pathlib import Path

from sparkstack.patch.overlay import load_overlay

ROOT = Path(__file__).parents[2]


def test_shipped_overlay_matches_the_deployment():
    o = load_overlay(ROOT / "overlays/dflash2")
    assert o.repo == "tonyd2wild/GLM-5.3-Flash-NVFP4-DFlash2-2x-DGX-Spark"
    assert o.rev == "06b681991fb7ca6743c4fba535cdc7e8df78cd4b" and o.subdir == "overlay-dflash2"
    assert o.vllm_root == "usr/local/lib/python3.12/dist-packages/vllm"
    assert {(i.file.path, i.dest) for i in o.installs} == {
        ("qwen3_dflash2.py", "model_executor/models/qwen3_dflash2.py"),
        ("dflash2/__init__.py", "v1/worker/gpu/spec_decode/dflash2/__init__.py"),
        ("dflash2/speculator.py", "v1/worker/gpu/spec_decode/dflash2/speculator.py"),
    }
    # The three steps the deployment applies, in its order; prefix_cache is optional; kv_page_lcm2 is absent.
    assert [s.name for s in o.enabled_steps()] == ["registry_and_select", "glm_aux_capture", "glm5_drafter_group"]
    assert [s.name for s in o.steps if not s.enabled] == ["prefix_cache_draft_group"]
    assert not any("kv_page_lcm2" in s.script.path for s in o.steps)
    markers = {s.name: s.markers for s in o.steps}
    assert "SM121-PORT" in markers["registry_and_select"]
    assert markers["glm_aux_capture"] == ("DFLASH2-AUX-CAPTURE",)
    assert markers["glm5_drafter_group"] == ("DFLASH2-DRAFTER-GROUP",)
    assert {"model_executor/models/registry.py", "config/vllm.py", "model_executor/layers/logits_processor.py"} <= set(
        next(s for s in o.steps if s.name == "registry_and_select").touches)
    assert any("DFlash2DraftModel" in " ".join(g) for g in o.runtime_gates)
    it = o.variants["instanttensor"]
    assert it.load_format == "instanttensor"
    assert any(w.file.startswith("nvidia_nccl_cu13-2.30.7-") for w in it.wheels)
    # Honest status: nothing is pinned until `sparkstack pin` runs against the real files.
    assert len(o.unpinned) == 6
