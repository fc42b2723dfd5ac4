import hashlib
import json
import os
from pathlib import Path

import pytest
import torch
from huggingface_hub import scan_cache_dir
from huggingface_hub.utils.sha import git_hash
from safetensors import safe_open
from safetensors.torch import load_file

import synth

SHARDS = synth.DEFAULT_SHARDS
MAIN_KEYS = {s.name for specs in SHARDS.values() for s in specs if not s.mtp}
MTP_KEYS = {s.name for specs in SHARDS.values() for s in specs if s.mtp}
MIXED, ALL_MTP, CLEAN = "model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors", "model-00001-of-00003.safetensors"


@pytest.fixture
def cache(tmp_path):
    flat = tmp_path / "flat"
    tensors = synth.write_model_dir(flat)
    entry = synth.cache_from_dir(flat, tmp_path / "hub")
    return entry, tensors


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


def _check_output_model(model_dir: Path, tensors: dict) -> None:
    loaded = {}
    for shard in sorted(model_dir.glob("*.safetensors")):
        loaded.update(load_file(str(shard)))
    assert set(loaded) == MAIN_KEYS
    for name in MAIN_KEYS:
        assert _same_bits(loaded[name], tensors[name]), name
    index = json.loads((model_dir / "model.safetensors.index.json").read_text())
    expected_map = {s.name: shard for shard, specs in SHARDS.items() for s in specs if not s.mtp}
    assert index["weight_map"] == expected_map
    assert index["metadata"]["total_size"] == sum(tensors[k].numel() * tensors[k].element_size() for k in MAIN_KEYS)
    assert not (model_dir / ALL_MTP).exists()
    with safe_open(str(model_dir / MIXED), "pt") as f:
        assert f.metadata() == {"format": "pt"}


def test_cache_entry_to_sibling_no_mtp_entry(cache, run_cli):
    entry, tensors = cache
    before = synth.tree_digest(entry)
    run_cli("strip", entry, check=0)
    assert synth.tree_digest(entry) == before

    dest = entry.with_name(entry.name + "-no-MTP")
    assert (dest / "refs" / "main").read_text() == synth.REVISION
    snap = dest / "snapshots" / synth.REVISION
    _check_output_model(snap, tensors)

    cfg = json.loads((snap / "config.json").read_text())
    for level in (cfg, cfg["text_config"]):
        assert level["num_nextn_predict_layers"] == 0
        assert level["index_share_for_mtp_iteration"] is False
    assert cfg["text_config"]["num_hidden_layers"] == synth.LAYERS

    # Every snapshot file is a relative link into blobs/, named as the hub names blobs.
    for link in snap.rglob("*"):
        if link.is_dir():
            continue
        target = os.readlink(link)
        assert not target.startswith("/")
        data = link.read_bytes()
        want = hashlib.sha256(data).hexdigest() if link.suffix == ".safetensors" else git_hash(data)
        assert Path(target).name == want, link
    # The clean shard is the very same inode as the source blob: no bytes moved.
    src_blob = (entry / "snapshots" / synth.REVISION / CLEAN).resolve()
    assert (snap / CLEAN).resolve().stat().st_ino == src_blob.stat().st_ino
    assert (snap / "chat_template_mm.jinja").read_bytes() == b"{{ messages }}\n"

    # huggingface_hub's own scanner reads the new entry as a proper cache repo.
    info = scan_cache_dir(entry.parent)
    repos = {r.repo_id: r for r in info.repos}
    assert not info.warnings
    out = repos["LibertAIDAI/GLM-5.3-Flash-NVFP4-no-MTP"]
    (rev,) = out.revisions
    assert rev.commit_hash == synth.REVISION and "main" in rev.refs
    assert {f.file_name for f in rev.files} >= {MIXED, CLEAN, "config.json", "model.safetensors.index.json"}


def test_second_run_is_a_no_op(cache, run_cli):
    entry, _ = cache
    run_cli("strip", entry, check=0)
    dest = entry.with_name(entry.name + "-no-MTP")
    before = synth.tree_digest(dest)
    inodes = {p: p.lstat().st_ino for p in dest.rglob("*")}
    proc = run_cli("strip", entry, check=0)
    assert "up to date" in proc.stdout
    assert synth.tree_digest(dest) == before
    assert {p: p.lstat().st_ino for p in dest.rglob("*")} == inodes
    plan = json.loads(run_cli("strip", entry, "--dry-run", "--json", check=0).stdout)
    assert plan["up_to_date"] is True


def test_a_plain_directory_output_is_up_to_date_until_its_files_change(run_cli, tmp_path):
    """A plain model directory in, a plain one out: a second run finds it up to date, and an edit in place of a
    file it wrote makes the next run redo the work."""
    entry = tmp_path / "model"
    synth.write_model_dir(entry)
    out = tmp_path / "plain"
    run_cli("strip", entry, "--out", out, check=0)
    assert not (out / "snapshots").exists() and (out / MIXED).is_file()  # a plain directory, not a cache entry
    proc = run_cli("strip", entry, "--out", out, check=0)
    assert "up to date" in proc.stdout, proc.stdout
    assert json.loads(run_cli("strip", entry, "--out", out, "--dry-run", "--json", check=0).stdout)["up_to_date"]
    _edit_in_place(out / MIXED, "model.layers.2.mlp.down_proj.weight")
    proc = run_cli("strip", entry, "--out", out, check=0)
    assert "up to date" not in proc.stdout


def _edit_in_place(path: Path, tensor: str) -> bytes:
    """Flip one byte of `tensor`'s data in the file behind `path`, keeping its inode and size, and move its
    mtime on by a second (so the test never hangs on the clock's granularity). Returns the tensor's new bytes."""
    real = path.resolve()
    before = real.stat()
    raw = bytearray(real.read_bytes())
    n = int.from_bytes(raw[:8], "little")
    begin, end = json.loads(raw[8:8 + n])[tensor]["data_offsets"]
    raw[8 + n + begin] ^= 0xFF
    with open(real, "r+b") as f:  # in place: no new inode, no rename
        f.write(raw)
    os.utime(real, ns=(before.st_atime_ns, before.st_mtime_ns + 10**9))
    after = real.stat()
    assert (after.st_ino, after.st_size) == (before.st_ino, before.st_size) and after.st_mtime_ns != before.st_mtime_ns
    return bytes(raw[8 + n + begin:8 + n + end])


def _tensor_bytes(path: Path, tensor: str) -> bytes:
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    begin, end = json.loads(raw[8:8 + n])[tensor]["data_offsets"]
    return raw[8 + n + begin:8 + n + end]


def test_a_shard_edited_in_place_same_size_is_never_up_to_date(cache, run_cli):
    """Size, inode and blob name stay; only the bytes and the mtime move. On the source side (an edit through
    a snapshot link) and on the output side (someone wrote into the stripped shard), strip must redo the work."""
    entry, _ = cache
    kept = "model.layers.2.mlp.down_proj.weight"  # in the mixed shard, kept: strip rewrites that shard
    run_cli("strip", entry, check=0)
    out = entry.with_name(entry.name + "-no-MTP") / "snapshots" / synth.REVISION / MIXED
    src = entry / "snapshots" / synth.REVISION / MIXED
    assert _tensor_bytes(out, kept) == _tensor_bytes(src, kept)

    edited = _edit_in_place(src, kept)
    proc = run_cli("strip", entry, check=0)
    assert "up to date" not in proc.stdout
    assert _tensor_bytes(out, kept) == edited  # the output follows the edited source

    _edit_in_place(out, kept)
    assert _tensor_bytes(out, kept) != edited
    proc = run_cli("strip", entry, check=0)
    assert "up to date" not in proc.stdout
    assert _tensor_bytes(out, kept) == edited  # the damaged output was rebuilt from the source


def test_dry_run_reports_plan_and_writes_nothing(cache, run_cli):
    entry, tensors = cache
    proc = run_cli("strip", entry, "--dry-run", "--json", check=0)
    plan = json.loads(proc.stdout)
    assert not entry.with_name(entry.name + "-no-MTP").exists()
    assert plan["mtp_tensors"] == len(MTP_KEYS)
    assert set(plan["mtp_sample_keys"]) <= MTP_KEYS and plan["mtp_sample_keys"]
    actions = {s["file"]: s["action"] for s in plan["shards"]}
    assert actions == {CLEAN: "link", MIXED: "rewrite", ALL_MTP: "drop"}
    mtp_bytes = sum(tensors[k].numel() * tensors[k].element_size() for k in MTP_KEYS)
    src_sizes = {s["file"]: s["bytes_in"] for s in plan["shards"]}
    out_mixed = next(s["bytes_out"] for s in plan["shards"] if s["file"] == MIXED)
    # Freed = all of the dropped shard + the mixed shard's shrinkage; the tensor bytes alone bound it.
    assert plan["bytes_freed"] == src_sizes[ALL_MTP] + src_sizes[MIXED] - out_mixed
    assert plan["bytes_freed"] >= mtp_bytes
    human = run_cli("strip", entry, "--dry-run", check=0).stdout
    assert "rewrite" in human and "drop" in human and f"MTP tensors: {len(MTP_KEYS)}" in human


def test_flat_dir_without_text_config(tmp_path, run_cli):
    flat = tmp_path / "model"
    tensors = synth.write_model_dir(flat, config=synth.base_config(text_config=False))
    before = synth.tree_digest(flat)
    run_cli("strip", flat, check=0)
    assert synth.tree_digest(flat) == before
    out = tmp_path / "model-no-MTP"
    _check_output_model(out, tensors)
    cfg = json.loads((out / "config.json").read_text())
    assert "text_config" not in cfg
    assert cfg["num_nextn_predict_layers"] == 0 and cfg["index_share_for_mtp_iteration"] is False
    assert (out / CLEAN).stat().st_ino == (flat / CLEAN).stat().st_ino


def test_snapshot_dir_and_explicit_out(cache, tmp_path, run_cli):
    entry, tensors = cache
    snap = entry / "snapshots" / synth.REVISION
    dest = tmp_path / "hub" / "models--me--custom"
    run_cli("strip", snap, "--out", dest, check=0)
    _check_output_model(dest / "snapshots" / synth.REVISION, tensors)


def test_index_only_keeps_shards_and_warns(cache, run_cli):
    entry, _ = cache
    proc = run_cli("strip", entry, "--index-only", check=0)
    assert "enumerates" in proc.stderr or "loads every" in proc.stderr
    snap = entry.with_name(entry.name + "-no-MTP") / "snapshots" / synth.REVISION
    src = entry / "snapshots" / synth.REVISION
    for shard in SHARDS:
        assert (snap / shard).resolve().stat().st_ino == (src / shard).resolve().stat().st_ino
    wm = json.loads((snap / "model.safetensors.index.json").read_text())["weight_map"]
    assert set(wm) == MAIN_KEYS


def test_index_only_dry_run_counts_what_it_takes_out_of_the_index(cache, run_cli):
    """The dry run says how many MTP tensors leave the index, the count the real run then takes out."""
    entry, _ = cache
    text = run_cli("strip", entry, "--index-only", "--dry-run", check=0).stdout
    assert f"MTP tensors: {len(MTP_KEYS)} (out of the index; the shards keep them)" in text
    doc = json.loads(run_cli("strip", entry, "--index-only", "--dry-run", "--json", check=0).stdout)
    assert (doc["mtp_tensors"], doc["mtp_tensors_removed_from"]) == (len(MTP_KEYS), "index")
    assert all(s["action"] == "link" for s in doc["shards"])
    run_cli("strip", entry, "--index-only", check=0)
    snap = entry.with_name(entry.name + "-no-MTP") / "snapshots" / synth.REVISION
    src_wm = json.loads((entry / "snapshots" / synth.REVISION / "model.safetensors.index.json").read_text())["weight_map"]
    out_wm = json.loads((snap / "model.safetensors.index.json").read_text())["weight_map"]
    assert len(src_wm) - len(out_wm) == len(MTP_KEYS)


def test_a_file_for_src_is_called_a_file(tmp_path, run_cli):
    shard = tmp_path / "model.safetensors"
    shard.write_bytes(b"not a dir")
    proc = run_cli("strip", shard, check=1)
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert f"{shard}: is a file; give the model's directory" in proc.stderr and str(tmp_path) in proc.stderr
    assert "no such directory" in run_cli("strip", tmp_path / "absent", check=1).stderr


def test_unindexed_shard_is_stripped_too(tmp_path, run_cli):
    """vLLM globs *.safetensors, so a shard the index forgets still gets its MTP tensors removed."""
    flat = tmp_path / "model"
    synth.write_model_dir(flat)
    extra = {"model.layers.3.stray.weight": torch.ones(4), "model.layers.0.stray.weight": torch.zeros(4)}
    from safetensors.torch import save_file
    save_file(extra, str(flat / "extra.safetensors"))
    run_cli("strip", flat, check=0)
    kept = load_file(str(tmp_path / "model-no-MTP" / "extra.safetensors"))
    assert set(kept) == {"model.layers.0.stray.weight"}


@pytest.mark.parametrize("method", ["copy_file_range", "sendfile", "readwrite"])
def test_every_copy_path_gives_the_same_bytes(cache, tmp_path, run_cli, method):
    entry, tensors = cache
    out = tmp_path / "hub" / f"models--x--{method}"
    proc = run_cli("strip", entry, "--out", out, "--json", env={"SPARKSTACK_COPY_METHOD": method}, check=0)
    assert json.loads(proc.stdout)["result"]["copy_method"] == method
    snap = out / "snapshots" / synth.REVISION
    _check_output_model(snap, tensors)
    # The rewritten shard's bytes are a function of the input alone.
    expected_header = _expected_mixed_header(entry / "snapshots" / synth.REVISION / MIXED)
    assert (snap / MIXED).read_bytes()[: len(expected_header)] == expected_header


def _expected_mixed_header(source_shard: Path) -> bytes:
    """The header the format asks for, built here by hand: kept entries in source order, packed, 8-aligned."""
    raw = source_shard.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    src = json.loads(raw[8 : 8 + n])
    doc, cursor = {"__metadata__": src.pop("__metadata__")}, 0
    for name, entry in sorted(src.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        if name in MTP_KEYS:
            continue
        begin, end = entry["data_offsets"]
        doc[name] = {"dtype": entry["dtype"], "shape": entry["shape"], "data_offsets": [cursor, cursor + end - begin]}
        cursor += end - begin
    body = json.dumps(doc, separators=(",", ":")).encode()
    body += b" " * (-len(body) % 8)
    return len(body).to_bytes(8, "little") + body


def test_new_revision_updates_existing_output(cache, tmp_path, run_cli):
    entry, tensors = cache
    run_cli("strip", entry, check=0)
    dest = entry.with_name(entry.name + "-no-MTP")
    old_snap = synth.tree_digest(dest / "snapshots" / synth.REVISION)

    # Upstream publishes a new revision in which one kept tensor changed.
    flat2 = tmp_path / "flat2"
    tensors2 = synth.write_model_dir(flat2)
    changed = "model.layers.2.mlp.down_proj.weight"
    tensors2[changed] = torch.full_like(tensors2[changed], 7)
    from safetensors.torch import save_file
    save_file({s.name: tensors2[s.name] for s in SHARDS[MIXED]}, str(flat2 / MIXED), metadata={"format": "pt"})
    rev2 = "f" * 40
    synth.cache_from_dir(flat2, entry.parent, revision=rev2)

    proc = run_cli("strip", entry, check=0)
    assert "up to date" not in proc.stdout
    assert (dest / "refs" / "main").read_text() == rev2
    _check_output_model(dest / "snapshots" / rev2, tensors2)
    assert synth.tree_digest(dest / "snapshots" / synth.REVISION) == old_snap
    assert not scan_cache_dir(entry.parent).warnings
