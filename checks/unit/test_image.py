"""image build / verify / patch check on fixture bases, validated with umoci and skopeo."""

import json
import subprocess
from pathlib import Path

import imagefix as fx
from clirun import need

VLLM = fx.VLLM




def build(run_cli, w, out, *extra, check=0, env=None):
    proc = run_cli("image", "build", "--base", w["base"], "--overlay", w["overlay"], "--overlay-src", w["src"],
                   "--out", out, "--json", *extra, check=check, env=env)
    return json.loads(proc.stdout)["result"] if check == 0 else proc


def manifest_of(layout: Path) -> dict:
    index = json.loads((layout / "index.json").read_text())
    digest = index["manifests"][0]["digest"].split(":")[1]
    return json.loads((layout / "blobs/sha256" / digest).read_text())


def test_two_builds_are_identical(image_world, run_cli, tmp_path):
    a = build(run_cli, image_world, tmp_path / "a")
    b = build(run_cli, image_world, tmp_path / "b", env={"SPARKSTACK_CACHE_DIR": str(tmp_path / "other-cache")})
    assert a["manifest_digest"] == b["manifest_digest"]
    assert a["config_digest"] == b["config_digest"]
    for name in ("index.json", "manifest.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_base_layers_reused_byte_for_byte(image_world, run_cli, tmp_path):
    r = build(run_cli, image_world, tmp_path / "out")
    layers = [l["digest"] for l in manifest_of(tmp_path / "out")["layers"]]
    assert layers[:-1] == image_world["digests"]["layers"]
    for d in image_world["digests"]["layers"]:
        hexd = d.split(":")[1]
        out_blob, base_blob = tmp_path / "out/blobs/sha256" / hexd, image_world["base"] / "blobs/sha256" / hexd
        assert out_blob.read_bytes() == base_blob.read_bytes()
        assert out_blob.stat().st_ino == base_blob.stat().st_ino  # hardlinked, not rewritten
    config = json.loads((tmp_path / "out/blobs/sha256" / r["config_digest"].split(":")[1]).read_text())
    labels = config["config"]["Labels"]
    assert labels["org.sparkstack.base.config"] == image_world["digests"]["config"]
    assert labels["org.sparkstack.overlay.pinned"] == "true"
    assert [s["name"] for s in json.loads(labels["org.sparkstack.overlay.steps"])] == [
        "registry_and_select", "glm_aux_capture", "glm5_drafter_group"]
    assert labels["fixture"] == "base"  # base labels kept
    assert len(config["rootfs"]["diff_ids"]) == 4 and len(config["history"]) == 4


def test_changing_one_overlay_file_changes_only_the_top_layer(image_world, run_cli, tmp_path):
    build(run_cli, image_world, tmp_path / "a")
    (image_world["src"] / "overlay-dflash2/dflash2/speculator.py").write_text("class DFlash2Speculator:\n    width = 7\n")
    toml = (image_world["overlay"] / "overlay.toml").read_bytes()
    # A source that differs from the pin is refused, the file named with both hashes; nothing is written.
    refused = run_cli("pin", "overlay", "--overlay", image_world["overlay"], "--overlay-src", image_world["src"], check=1)
    assert "1 file(s) differ from what" in refused.stderr and "dflash2/speculator.py (pinned " in refused.stderr
    assert "--repin" in refused.stderr and refused.stderr.count("\n") == 1
    assert (image_world["overlay"] / "overlay.toml").read_bytes() == toml
    run_cli("pin", "overlay", "--overlay", image_world["overlay"], "--overlay-src", image_world["src"], "--repin", check=0)
    build(run_cli, image_world, tmp_path / "b")
    la, lb = manifest_of(tmp_path / "a")["layers"], manifest_of(tmp_path / "b")["layers"]
    assert la[:-1] == lb[:-1] and la[-1] != lb[-1]


def test_output_passes_umoci_and_skopeo(image_world, run_cli, tmp_path):
    umoci, skopeo = need("umoci"), need("skopeo")
    r = build(run_cli, image_world, tmp_path / "out")
    tag = r["name"].split(":")[1]
    bundle = tmp_path / "bundle"
    subprocess.run([umoci, "unpack", "--image", f"{tmp_path / 'out'}:{tag}", str(bundle)], check=True, capture_output=True)
    site = bundle / "rootfs" / fx.SITE
    vllm = bundle / "rootfs" / VLLM
    # Overlay installed, patches applied where the container sees them, base semantics intact.
    assert (vllm / "model_executor/models/qwen3_dflash2.py").read_text() == fx.OVERLAY_FILES["qwen3_dflash2.py"]
    assert (vllm / "v1/worker/gpu/spec_decode/dflash2/speculator.py").is_file()
    assert "DFlash2DraftModel" in (vllm / "model_executor/models/registry.py").read_text()
    assert (vllm / "models").is_symlink()  # the base's link survives; the patch went through it
    assert "DFLASH2-AUX-CAPTURE" in (vllm / "model_executor/models/glm5next/nvidia/model.py").read_text()
    assert "DFLASH2-DRAFTER-GROUP" in (vllm / "v1/core/kv_cache_utils.py").read_text()
    assert not (vllm / "stale.py").exists()
    assert sorted(p.name for p in (vllm / "old_dir").iterdir()) == ["b.py"]
    assert "PREFIX-CACHE-DRAFT" not in (vllm / "v1/core/kv_cache_coordinator.py").read_text()  # optional, off
    assert (site / "nvidia/nccl/include/nccl.h").exists()
    subprocess.run([skopeo, "copy", f"oci:{tmp_path / 'out'}:{tag}", f"dir:{tmp_path / 'copied'}"], check=True,
                   capture_output=True)


def test_tar_output_and_every_base_format_agree(image_world, run_cli, tmp_path):
    skopeo = need("skopeo")
    ref = build(run_cli, image_world, tmp_path / "ref")
    fx.layout_to_oci_archive(image_world["base"], tmp_path / "base-oci.tar")
    fx.layout_to_docker_archive(image_world["base"], tmp_path / "base-docker.tar")
    for base in ("base-oci.tar", "base-docker.tar"):
        w = dict(image_world, base=tmp_path / base)
        r = build(run_cli, w, tmp_path / f"from-{base}.tar")
        assert r["config_digest"] == ref["config_digest"], base
        run_cli("image", "verify", tmp_path / f"from-{base}.tar", check=0)
        subprocess.run([skopeo, "copy", f"oci-archive:{tmp_path / f'from-{base}.tar'}", f"dir:{tmp_path / base}.dir"],
                       check=True, capture_output=True)


def test_rebuild_reads_no_base_layer_bytes(image_world, run_cli, tmp_path):
    first = build(run_cli, image_world, tmp_path / "a")
    assert first["cache"]["layer_bytes_read"] > 0
    second = build(run_cli, image_world, tmp_path / "b")
    assert second["cache"]["layer_bytes_read"] == 0 and second["cache"]["layers_read"] == 0
    again = build(run_cli, image_world, tmp_path / "b")
    assert again["up_to_date"] is True


def test_drift_report_names_the_drifted_edit_and_shows_the_diff(image_world, run_cli, tmp_path):
    ok = json.loads(run_cli("patch", "check", "--base", image_world["base"], "--overlay", image_world["overlay"],
                            "--overlay-src", image_world["src"], "--json", check=0).stdout)
    assert {s["step"]: s["status"] for s in ok["steps"]} == {
        "registry_and_select": "applicable", "glm_aux_capture": "applicable", "glm5_drafter_group": "applicable"}

    # Upstream vLLM renamed an argument on the line the GLM aux-capture anchor needs.
    drifted_glm = fx.GLM_MODEL_PY.replace("layer(hidden_states, positions)", "layer(hidden_states, position_ids)")
    layers = fx.default_layers()
    layers[0] = (layers[0][0], [(n, k, drifted_glm if n.endswith("glm5next/nvidia/model.py") else p)
                                for n, k, p in layers[0][1]])
    fx.write_base(tmp_path / "drifted", layers=layers)
    proc = run_cli("patch", "check", "--base", tmp_path / "drifted", "--overlay", image_world["overlay"],
                   "--overlay-src", image_world["src"], "--json")
    assert proc.returncode == 1
    assert proc.stderr.strip() == "sparkstack: error: steps a build cannot apply (drifted or gone): glm_aux_capture"
    steps = {s["step"]: s for s in json.loads(proc.stdout)["steps"]}
    assert steps["registry_and_select"]["status"] == "applicable"
    (edit,) = steps["glm_aux_capture"]["edits"]
    assert edit["status"] == "drifted" and edit["marker"] == "DFLASH2-AUX-CAPTURE" and edit["matches"] == 0
    assert "-            hidden_states = layer(hidden_states, positions)" in edit["diff"]
    assert "+            hidden_states = layer(hidden_states, position_ids)" in edit["diff"]
    # The build refuses the same base, naming the step.
    proc = build(run_cli, dict(image_world, base=tmp_path / "drifted"), tmp_path / "x", check=1)
    assert "glm_aux_capture" in proc.stderr and not (tmp_path / "x").exists()


def test_drift_report_dry_runs_scripts_without_literal_edits(image_world, run_cli):
    proc = run_cli("patch", "check", "--base", image_world["base"], "--overlay", image_world["overlay"], "--overlay-src",
                   image_world["src"], "--with-step", "prefix_cache_draft_group", "--json", check=0)
    steps = {s["step"]: s for s in json.loads(proc.stdout)["steps"]}
    assert steps["prefix_cache_draft_group"]["method"] == "dry-run"
    assert steps["prefix_cache_draft_group"]["status"] == "applicable"


def test_base_already_patched_reports_applied(image_world, run_cli, tmp_path):
    r = build(run_cli, image_world, tmp_path / "patched")
    proc = run_cli("patch", "check", "--base", tmp_path / "patched", "--platform", "linux/arm64", "--overlay",
                   image_world["overlay"], "--overlay-src", image_world["src"], "--json", check=0)
    assert {s["status"] for s in json.loads(proc.stdout)["steps"]} == {"applied"}
    assert r["config_digest"]


def test_unpinned_overlay_needs_a_flag_and_is_labelled(image_world, run_cli, tmp_path):
    fx.write_overlay(image_world["overlay"])  # all hashes "unpinned"
    proc = build(run_cli, image_world, tmp_path / "out", check=1)
    assert proc.stderr.count("\n") == 1 and "unpinned" in proc.stderr and not (tmp_path / "out").exists()
    r = build(run_cli, image_world, tmp_path / "out", "--allow-unpinned")
    config = json.loads((tmp_path / "out/blobs/sha256" / r["config_digest"].split(":")[1]).read_text())
    assert config["config"]["Labels"]["org.sparkstack.overlay.pinned"] == "unpinned"


def test_tampered_overlay_file_is_refused(image_world, run_cli, tmp_path):
    (image_world["src"] / "overlay-dflash2/qwen3_dflash2.py").write_text("evil = True\n")
    proc = build(run_cli, image_world, tmp_path / "out", check=1)
    assert "does not match the pinned" in proc.stderr and not (tmp_path / "out").exists()


def test_verify_catches_a_corrupt_blob(image_world, run_cli, tmp_path):
    build(run_cli, image_world, tmp_path / "out")
    run_cli("image", "verify", tmp_path / "out", check=0)
    top = manifest_of(tmp_path / "out")["layers"][-1]["digest"].split(":")[1]
    blob = tmp_path / "out/blobs/sha256" / top
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))
    proc = run_cli("image", "verify", tmp_path / "out")
    assert proc.returncode == 1 and proc.stderr.startswith("sparkstack: error:") and proc.stderr.count("\n") == 1


def test_zstd_layers_are_read(image_world, run_cli, tmp_path):
    fx.write_base(tmp_path / "zbase", layers=fx.default_layers(compressions=("gzip", "zstd", "none")))
    r = build(run_cli, dict(image_world, base=tmp_path / "zbase"), tmp_path / "out")
    # The zstd layer holds the kv_cache_utils.py the drafter-group step patches.
    assert any(p.endswith("v1/core/kv_cache_utils.py") for p in r["changed"])
    run_cli("image", "verify", tmp_path / "out", check=0)


def test_platform_selection(image_world, run_cli, tmp_path):
    fx.write_base(tmp_path / "amd", arch="amd64", index_platform=False)
    proc = build(run_cli, dict(image_world, base=tmp_path / "amd"), tmp_path / "out", check=1)
    assert "linux/amd64" in proc.stderr and "--platform" in proc.stderr
    build(run_cli, dict(image_world, base=tmp_path / "amd"), tmp_path / "out", "--platform", "linux/amd64")


def test_dry_run_plans_without_reading_layers(image_world, run_cli, tmp_path):
    proc = run_cli("image", "build", "--base", image_world["base"], "--overlay", image_world["overlay"], "--overlay-src",
                   image_world["src"], "--out", tmp_path / "out", "--dry-run", "--json", check=0)
    plan = json.loads(proc.stdout)
    assert [s["name"] for s in plan["steps"]] == ["registry_and_select", "glm_aux_capture", "glm5_drafter_group"]
    assert f"/{VLLM}/models/glm5next/nvidia/model.py" in plan["extract"]
    assert not (tmp_path / "out").exists() and not (tmp_path / "cache").exists()


def test_instanttensor_variant_installs_wheels_and_whites_out_superseded(image_world, run_cli, tmp_path):
    umoci = need("umoci")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    names = [fx.make_wheel(wheels, "instanttensor", "0.3.1", {"instanttensor/__init__.py": "LOADER = 'it'\n"}),
             fx.make_wheel(wheels, "nvidia_nccl_cu13", "2.30.7", {"nvidia/nccl/lib/libnccl.so.2": "nccl 2.30.7\n"})]
    fx.write_overlay(image_world["overlay"], pinned_from=image_world["src"] / "overlay-dflash2", wheels=names, wheel_dir=wheels)
    r = build(run_cli, image_world, tmp_path / "out", "--variant", "instanttensor", "--wheels", wheels)
    tag = r["name"].split(":")[1]
    assert tag.startswith("instanttensor-")
    bundle = tmp_path / "bundle"
    subprocess.run([umoci, "unpack", "--image", f"{tmp_path / 'out'}:{tag}", str(bundle)], check=True, capture_output=True)
    site = bundle / "rootfs" / fx.SITE
    assert (site / "instanttensor/__init__.py").read_text() == "LOADER = 'it'\n"
    assert (site / "nvidia/nccl/lib/libnccl.so.2").read_text() == "nccl 2.30.7\n"
    assert (site / "nvidia_nccl_cu13-2.30.7.dist-info/RECORD").is_file()
    assert not (site / "nvidia_nccl_cu13-2.29.7.dist-info").exists()
    assert not (site / "nvidia/nccl/include/nccl.h").exists()  # in the old RECORD, not in the new wheel
    # The same layer still carries the overlay and patches.
    assert (bundle / "rootfs" / VLLM / "model_executor/models/qwen3_dflash2.py").is_file()


def test_wheel_with_wrong_hash_is_refused(image_world, run_cli, tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    name = fx.make_wheel(wheels, "instanttensor", "0.3.1", {"instanttensor/__init__.py": "x = 1\n"})
    fx.write_overlay(image_world["overlay"], pinned_from=image_world["src"] / "overlay-dflash2", wheels=[name], wheel_dir=wheels)
    fx.make_wheel(wheels, "instanttensor", "0.3.1", {"instanttensor/__init__.py": "x = 2\n"})  # swapped behind our back
    proc = build(run_cli, image_world, tmp_path / "out", "--variant", "instanttensor", "--wheels", wheels, check=1)
    assert "does not match the pinned" in proc.stderr


def test_symlinked_blobs_and_multi_arch_index(image_world, run_cli, tmp_path):
    """The Nix side hands over a layout whose blobs are symlinks to per-blob store paths, and an index may be multi-arch."""
    store = tmp_path / "store"
    store.mkdir()
    amd = tmp_path / "amd"
    fx.write_base(amd, arch="amd64")
    multi = tmp_path / "multi"
    (multi / "blobs/sha256").mkdir(parents=True)
    for layout in (image_world["base"], amd):
        for blob in (layout / "blobs/sha256").iterdir():
            target = store / blob.name
            if not target.exists():
                target.write_bytes(blob.read_bytes())
            link = multi / "blobs/sha256" / blob.name
            if not link.exists():
                link.symlink_to(target)
    manifests = [json.loads((l / "index.json").read_text())["manifests"][0] for l in (amd, image_world["base"])]
    (multi / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": manifests}))
    (multi / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    arm = build(run_cli, dict(image_world, base=multi), tmp_path / "arm-out")
    ref = build(run_cli, image_world, tmp_path / "ref")
    assert arm["config_digest"] == ref["config_digest"]  # linux/arm64 picked by default
    out_blob = tmp_path / "arm-out/blobs/sha256" / image_world["digests"]["layers"][0].split(":")[1]
    assert not out_blob.is_symlink() and out_blob.stat().st_ino == (store / out_blob.name).stat().st_ino
    amd_out = build(run_cli, dict(image_world, base=multi), tmp_path / "amd-out", "--platform", "linux/amd64")
    assert amd_out["base_config_digest"] != arm["base_config_digest"]


def test_the_merged_view_of_the_base_is_what_umoci_unpacks(image_world, tmp_path):
    """Whiteouts and opaque dirs, as sparkstack's merged view reads them, against umoci's unpack of the same base:
    every directory of the base lists the same names, and a whited-out file is absent (the real tool decides)."""
    import os

    from sparkstack.oci.layers import LayerCache
    from sparkstack.oci.rootfs import open_rootfs

    umoci = need("umoci")
    bundle = tmp_path / "bundle"
    subprocess.run([umoci, "unpack", "--image", f"{image_world['base']}:base", str(bundle)], check=True, capture_output=True)
    root = bundle / "rootfs"
    src, _, fs = open_rootfs(image_world["base"], "linux/arm64", [], LayerCache(tmp_path / "layer-cache"))
    try:
        dirs = [d for d, _, _ in os.walk(root)]
        assert len(dirs) > 5
        for d in dirs:
            rel = os.path.relpath(d, root)
            rel = "" if rel == "." else rel
            if os.path.islink(d):
                continue
            assert fs.list_dir(rel) == sorted(os.listdir(d)), rel
        assert fs.lookup(f"{VLLM}/stale.py") is None and not (root / VLLM / "stale.py").exists()
        assert fs.list_dir(f"{VLLM}/old_dir") == ["b.py"]
    finally:
        src.close()
