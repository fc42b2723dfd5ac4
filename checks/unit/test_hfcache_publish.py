"""hfcache.publish_snapshot killed (SIGKILL, checks/killfix.py) before each of its steps, one step at a time.

After every kill, a reader of the entry (huggingface_hub's own offline resolution, then the bytes of
every file) must find refs/main naming a snapshot that is whole: the old revision's files or the new
one's, never a missing dir, a broken link or a mix. The bookkeeping, written last, must never describe
a snapshot that is not in place. Expected contents are what the test itself wrote, file by file.
"""

import json
import shutil
from pathlib import Path

import pytest
import synth
from killfix import loader_view, run_killed_before
from sparkstack import fsio, hfcache

REPO = "LibertAIDAI/GLM-5.3-Flash-NVFP4"
ENTRY = "models--LibertAIDAI--GLM-5.3-Flash-NVFP4"
OLD, NEW = "a" * 40, "b" * 40
RECORD = "published.json"


def _model(flat: Path, fill: bytes) -> dict[str, bytes]:
    """Two shards (the first is the same bytes in every version, so its blob is shared), an index, a config."""
    flat.mkdir(parents=True)
    synth.write_raw_shard(flat / "model-00001-of-00002.safetensors", [("model.layers.0.w", 4096)], b"\x11")
    synth.write_raw_shard(flat / "model-00002-of-00002.safetensors", [("model.layers.1.w", 4096)], fill)
    wm = {"model.layers.0.w": "model-00001-of-00002.safetensors", "model.layers.1.w": "model-00002-of-00002.safetensors"}
    (flat / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    (flat / "config.json").write_text(json.dumps({"num_hidden_layers": 2, "fill": fill.hex()}))
    return {p.name: p.read_bytes() for p in flat.iterdir()}


def _world(tmp: Path, new_revision: str) -> tuple[Path, Path, dict[str, bytes], dict[str, bytes]]:
    """An entry at OLD, and a stage holding `new_revision` with one shard and the config changed."""
    old = _model(tmp / "old", b"\x22")
    new = _model(tmp / "new", b"\x33")
    synth.cache_from_dir(tmp / "old", tmp / "hub", REPO, OLD)
    staged = synth.cache_from_dir(tmp / "new", tmp / "stagehub", REPO, new_revision)
    shutil.rmtree(staged / "refs")  # a stage is blobs and one snapshot; publishing writes the ref
    return tmp / "hub", staged, old, new


def _publish_killed_before(step: int, stage: Path, entry: Path, revision: str, set_main: bool) -> int | None:
    record = {RECORD: json.dumps({"revision": revision}).encode()}
    return run_killed_before(step, lambda: hfcache.publish_snapshot(stage, entry, revision, record, set_main=set_main))


def _reader_view(hub: Path) -> tuple[str, dict[str, bytes]]:
    revision = hfcache.read_ref(hub / ENTRY)
    assert revision is not None, "refs/main is gone"
    seen, files = loader_view(hub, REPO)
    assert seen == revision
    return seen, files


def _record(entry: Path) -> str | None:
    path = entry / ".sparkstack" / RECORD
    return json.loads(path.read_text())["revision"] if path.exists() else None


CASES = {
    # A new revision on an existing entry, main moving to it (strip of a newer commit, fetch of a new pin).
    "new-revision": (NEW, True),
    # The same revision published again with other bytes (strip's output rebuilt after its input changed).
    "same-revision": (OLD, True),
    # A new revision beside the one main names, main left alone (strip of a snapshot that is not main).
    "beside-main": (NEW, False),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_publish_killed_before_any_step_leaves_refs_main_on_a_whole_snapshot(tmp_path, case):
    revision, set_main = CASES[case]
    hub, stage, old, new = _world(tmp_path / "pristine", revision)
    # What a reader may find at each revision main can name, at any moment: the whole old files or the whole new.
    allowed = {OLD: [old] + ([new] if revision == OLD else []), NEW: [new] if set_main else []}

    done = tmp_path / "done"
    shutil.copytree(tmp_path / "pristine", done, symlinks=True)
    steps = _publish_killed_before(-1, done / "stagehub" / ENTRY, done / "hub" / ENTRY, revision, set_main)
    assert steps is not None and steps >= 4  # every blob, the snapshot, the ref, the record: each a step
    # Run through, it publishes: main where asked, the new snapshot whole, the record naming it.
    seen, files = _reader_view(done / "hub")
    assert seen == (revision if set_main else OLD) and files == (new if set_main else old)
    assert _record(done / "hub" / ENTRY) == revision
    assert hfcache.snapshot_state(done / "hub" / ENTRY, revision).complete

    for step in range(steps):
        run = tmp_path / f"killed-{step}"
        shutil.copytree(tmp_path / "pristine", run, symlinks=True)
        entry = run / "hub" / ENTRY
        assert _publish_killed_before(step, run / "stagehub" / ENTRY, entry, revision, set_main) is None
        try:
            seen, files = _reader_view(run / "hub")
        except AssertionError as exc:
            raise AssertionError(f"killed before step {step}: {exc}") from None
        assert seen in allowed and files in allowed[seen], (
            f"killed before step {step}: refs/main names {seen[:8]} with files {sorted(files)} "
            f"that are not a whole revision")
        assert hfcache.snapshot_state(entry).complete, f"killed before step {step}"
        if _record(entry) is not None:  # written last: it never describes a snapshot that is not in place
            recorded = _record(entry)
            assert hfcache.snapshot_state(entry, recorded).complete, f"killed before step {step}"
            assert {p.name: p.read_bytes() for p in hfcache.snapshot_dir(entry, recorded).iterdir()} == new


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_replace_dir_swaps_in_one_step_and_where_it_cannot_still_lands_whole(tmp_path, monkeypatch):
    for fallback in (False, True):
        base = tmp_path / ("fallback" if fallback else "exchange")
        (base / "dest/sub").mkdir(parents=True)
        (base / "dest/sub/old.txt").write_bytes(b"old")
        (base / "new/sub").mkdir(parents=True)
        (base / "new/sub/new.txt").write_bytes(b"new")
        if fallback:  # a filesystem without RENAME_EXCHANGE: moved aside, then renamed in
            monkeypatch.setattr(fsio, "exchange", lambda a, b: False)
        fsio.replace_dir(base / "new", base / "dest")
        assert _tree(base / "dest") == {"sub/new.txt": b"new"}
        assert sorted(p.name for p in base.iterdir()) == ["dest"]  # the old tree is gone, nothing left beside
    # A dest that is a link to a dir is replaced itself; what it pointed at is not touched.
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere/keep.txt").write_bytes(b"keep")
    (tmp_path / "link").symlink_to("elsewhere")
    (tmp_path / "new").mkdir()
    (tmp_path / "new/x").write_bytes(b"x")
    fsio.replace_dir(tmp_path / "new", tmp_path / "link")
    assert not (tmp_path / "link").is_symlink() and _tree(tmp_path / "link") == {"x": b"x"}
    assert _tree(tmp_path / "elsewhere") == {"keep.txt": b"keep"}


def test_exchange_swaps_two_trees_and_names_a_missing_one(tmp_path):
    pair = tmp_path / "a", tmp_path / "b"
    for d, text in zip(pair, (b"A", b"B")):
        d.mkdir()
        (d / "f").write_bytes(text)
    assert fsio.exchange(*pair)
    assert (tmp_path / "a/f").read_bytes() == b"B" and (tmp_path / "b/f").read_bytes() == b"A"
    with pytest.raises(FileNotFoundError):
        fsio.exchange(tmp_path / "a", tmp_path / "absent")
