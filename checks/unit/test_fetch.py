"""`fetch` end to end through the real CLI and the real huggingface_hub, against the hub stand-in (HF_ENDPOINT).

What is expected comes from what the stand-in holds (its commits and their bytes), and the cache is read back
with huggingface_hub's own scanner, never only from what sparkstack reports.
"""

import hashlib
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from clirun import one_error_line, sparkstack_cmd, start
from hub_standin import DRAFTER, MODEL, blob_name, recipe_copy
from huggingface_hub import scan_cache_dir

MODEL_ENTRY, DRAFTER_ENTRY = "models--LibertAIDAI--GLM-5.3-Flash-NVFP4", "models--incoai--GLM-5.3-Flash-DFlash2"
SHARD = "model-00002-of-00003.safetensors"


def fetch(run_cli, w, *args, env=None, recipe=None):
    recipe = recipe or w.get("recipe") or recipe_copy(w["tmp"] / "recipe.toml", *w["pinned"].values())
    return run_cli("fetch", "--recipe", recipe, *args, env={**w["env"], **(env or {})})


def tree(root) -> dict:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            path = Path(p)
            out[p] = os.readlink(p) if path.is_symlink() else (path.read_bytes() if path.is_file() else "dir")
    return out


def snapshot_files(w, entry, commit) -> dict[str, bytes]:
    snap = w["hf"] / "hub" / entry / "snapshots" / commit
    return {p.relative_to(snap).as_posix(): p.read_bytes() for p in snap.rglob("*") if p.is_file()}


def test_resolve_pins_the_commits_the_hub_holds_and_keeps_the_recipes_comments(run_cli, hub_world):
    recipe = recipe_copy(hub_world["tmp"] / "mine.toml")
    before = recipe.read_text()
    proc = fetch(run_cli, hub_world, "--resolve", "--json", recipe=recipe)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["written"] is True
    after = recipe.read_text()
    model, drafter = hub_world["pinned"][MODEL], hub_world["pinned"][DRAFTER]
    changed = [(a, b) for a, b in zip(before.splitlines(), after.splitlines()) if a != b]
    assert changed == [('model_revision = "unpinned"', f'model_revision = "{model}"'),
                       ('revision = "unpinned"  # `sparkstack fetch --resolve` pins it',
                        f'revision = "{drafter}"  # `sparkstack fetch --resolve` pins it')]
    assert len(before.splitlines()) == len(after.splitlines())
    # Both repos were asked for their current commit; nothing was downloaded.
    asked = [r["path"] for r in hub_world["hub"].requests("api")]
    assert sorted(asked) == sorted([f"/api/models/{MODEL}", f"/api/models/{DRAFTER}"])
    assert hub_world["hub"].requests("get") == [] and not hub_world["hf"].exists()
    # Pinned now: a second --resolve asks nothing and writes nothing.
    hub_world["hub"].log.clear()
    proc = fetch(run_cli, hub_world, "--resolve", recipe=recipe)
    assert proc.returncode == 0 and "up to date" in proc.stdout
    assert hub_world["hub"].requests() == [] and recipe.read_text() == after


def test_resolve_keeps_the_recipes_mode_and_byte_order_mark(run_cli, hub_world):
    recipe = recipe_copy(hub_world["tmp"] / "mine.toml")
    recipe.write_bytes(b"\xef\xbb\xbf" + recipe.read_bytes())
    recipe.chmod(0o640)
    proc = fetch(run_cli, hub_world, "--resolve", recipe=recipe)
    assert proc.returncode == 0, proc.stderr
    assert recipe.read_bytes().startswith(b"\xef\xbb\xbf" + b"#")
    assert hub_world["pinned"][MODEL] in recipe.read_text(encoding="utf-8-sig")
    assert recipe.stat().st_mode & 0o777 == 0o640


def test_resolve_refuses_a_symlinked_recipe_and_leaves_it_as_it_was(run_cli, hub_world):
    target = recipe_copy(hub_world["tmp"] / "target.toml")
    link = hub_world["tmp"] / "link.toml"
    link.symlink_to(target)
    before = target.read_bytes()
    line = one_error_line(fetch(run_cli, hub_world, "--resolve", recipe=link))
    assert f"{link}: is a symlink" in line
    assert link.is_symlink() and os.readlink(link) == str(target) and target.read_bytes() == before


def test_a_pin_written_since_the_recipe_was_read_is_never_overwritten(tmp_path):
    """Two resolves at once (or an editor): the file's pin changed between reading the recipe and writing it.
    Writing would silently replace the other pin; it is refused, and the file keeps what the other one wrote."""
    from sparkstack.errors import SparkstackError
    from sparkstack.fetch.plan import RESOLVE
    from sparkstack.recipe import load_recipe, write_revisions

    path = recipe_copy(tmp_path / "mine.toml")
    recipe = load_recipe(str(path))  # read while unpinned
    theirs, ours = "1" * 40, "2" * 40
    path.write_text(path.read_text().replace('model_revision = "unpinned"', f'model_revision = "{theirs}"'))
    before = path.read_bytes()
    with pytest.raises(SparkstackError, match="model_revision changed since it was read; run again"):
        write_revisions(recipe, ours, None, RESOLVE)
    assert path.read_bytes() == before
    write_revisions(load_recipe(str(path)), None, ours, RESOLVE)  # read afresh, the drafter's pin goes in beside theirs
    assert load_recipe(str(path)).model_revision == theirs and load_recipe(str(path)).drafter_revision == ours


def test_fetch_downloads_exactly_the_pinned_commit_after_main_moves(run_cli, hub_world):
    pinned = hub_world["pinned"][MODEL]
    repo = hub_world["repos"][MODEL]
    moved = dict(repo.commits[pinned])
    moved["config.json"] = b'{"moved": true}\n'
    moved[SHARD] = moved[SHARD][:-1] + b"\x00"
    new = repo.commit(moved)
    assert repo.refs["main"] == new != pinned
    proc = fetch(run_cli, hub_world)
    assert proc.returncode == 0, proc.stderr
    hub_dir = hub_world["hf"] / "hub"
    # huggingface_hub's scanner reads both entries, each at exactly its pinned commit, with refs/main on it.
    scan = scan_cache_dir(hub_dir)
    assert scan.warnings == []
    revisions = {r.repo_id: {x.commit_hash for x in r.revisions} for r in scan.repos}
    assert revisions == {MODEL: {pinned}, DRAFTER: {hub_world["pinned"][DRAFTER]}}
    assert {r.repo_id: r.refs["main"].commit_hash for r in scan.repos} == {MODEL: pinned, DRAFTER: hub_world["pinned"][DRAFTER]}
    assert snapshot_files(hub_world, MODEL_ENTRY, pinned) == repo.commits[pinned]
    assert snapshot_files(hub_world, DRAFTER_ENTRY, hub_world["pinned"][DRAFTER]) == hub_world["repos"][DRAFTER].commits[hub_world["pinned"][DRAFTER]]
    # Every file was asked for by commit, never by branch.
    gets = hub_world["hub"].downloads()
    assert gets and all(f"/resolve/{pinned}/" in r["path"] or f"/resolve/{hub_world['pinned'][DRAFTER]}/" in r["path"]
                        for r in gets)
    assert len(gets) == len(repo.commits[pinned]) + len(hub_world["repos"][DRAFTER].commits[hub_world["pinned"][DRAFTER]])
    assert not (hub_dir / ".sparkstack-fetch").exists()  # the stage is gone once published


def test_a_second_fetch_is_up_to_date_and_asks_the_hub_nothing(run_cli, hub_world):
    assert fetch(run_cli, hub_world).returncode == 0
    before = tree(hub_world["hf"])
    hub_world["hub"].log.clear()
    proc = fetch(run_cli, hub_world)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count(": up to date") == 2
    assert hub_world["hub"].requests() == []  # the file list of a commit never changes: the first fetch recorded it
    assert tree(hub_world["hf"]) == before


def test_a_dropped_connection_resumes_where_it_broke(run_cli, hub_world):
    """A shard of three download chunks; the stand-in closes the connection half way through its first body."""
    import torch
    from huggingface_hub.constants import DOWNLOAD_CHUNK_SIZE as CHUNK
    from safetensors.torch import save_file

    big = hub_world["tmp"] / "big.safetensors"
    save_file({"w": torch.randint(0, 256, (3 * CHUNK - 1000,), dtype=torch.uint8)}, str(big))
    repo = hub_world["repos"][MODEL]
    commit = repo.commit({**repo.commits[hub_world["pinned"][MODEL]], "big.safetensors": big.read_bytes()})
    size = big.stat().st_size
    hub_world["hub"].faults["drop_once"] = "big.safetensors"
    proc = fetch(run_cli, hub_world, recipe=recipe_copy(hub_world["tmp"] / "big.toml", commit, hub_world["pinned"][DRAFTER]))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # huggingface_hub's own retry warnings stay quiet: the result says what happened
    gets = [r for r in hub_world["hub"].requests("get") if r["file"] == "big.safetensors"]
    # huggingface_hub writes whole chunks: after the cut it asks, with a Range, for what follows the last one it kept.
    kept = (size // 2) // CHUNK * CHUNK
    assert kept > 0
    assert [r.get("range_start", 0) for r in gets] == [0, kept]
    assert [r["body_bytes"] for r in gets] == [size // 2, size - kept]
    assert snapshot_files(hub_world, MODEL_ENTRY, commit)["big.safetensors"] == big.read_bytes()


def test_a_failed_fetch_publishes_nothing_and_the_next_one_resumes_from_what_finished(run_cli, hub_world):
    pinned = hub_world["pinned"][MODEL]
    files = hub_world["repos"][MODEL].commits[pinned]
    # Files start biggest first and none starts after a failure: the smallest one failing lets all others finish.
    missing = min(files, key=lambda k: len(files[k]))
    hub_world["hub"].faults["missing"] = missing
    line = one_error_line(fetch(run_cli, hub_world))
    assert f"{MODEL}@{pinned}: {missing}" in line and "no such file (404)" in line
    assert not (hub_world["hf"] / "hub" / MODEL_ENTRY).exists()  # nothing published
    # One staged file goes bad in between (same size, one byte): it is not trusted, it goes again.
    config_blob = blob_name("config.json", files["config.json"])
    staged = next((hub_world["hf"] / "hub").rglob(f".sparkstack-fetch/*/{MODEL_ENTRY}/blobs/{config_blob}"))
    staged.write_bytes(b"X" + files["config.json"][1:])
    hub_world["hub"].faults.clear()
    hub_world["hub"].log.clear()
    proc = fetch(run_cli, hub_world, "--json")
    assert proc.returncode == 0, proc.stderr
    (model,) = [r for r in json.loads(proc.stdout)["results"] if r["label"] == "model"]
    assert (model["downloaded"], model["resumed"]) == (2, len(files) - 2)
    assert sorted(r["file"] for r in hub_world["hub"].downloads() if f"/{MODEL}/" in r["path"]) == sorted([missing, "config.json"])
    assert snapshot_files(hub_world, MODEL_ENTRY, pinned) == files
    assert not (hub_world["hf"] / "hub" / MODEL_ENTRY / ".no_exist").exists()  # the 404 met before is not published


# SIGKILL leaves what a crash leaves; SIGTERM and SIGHUP stop it as Ctrl-C does, with the same partials kept
@pytest.mark.parametrize("sig,code", [(signal.SIGKILL, -signal.SIGKILL), (signal.SIGTERM, 143), (signal.SIGHUP, 129)],
                         ids=["kill", "term", "hup"])
def test_a_fetch_killed_mid_file_publishes_nothing_and_the_next_one_finishes_clean(run_cli, hub_world, sig, code):
    pinned = hub_world["pinned"][MODEL]
    files = hub_world["repos"][MODEL].commits[pinned]
    hub_world["hub"].faults["stall"] = SHARD
    recipe = recipe_copy(hub_world["tmp"] / "recipe.toml", *hub_world["pinned"].values())
    proc = start(sparkstack_cmd() + ["fetch", "--recipe", str(recipe)], env={**os.environ, **hub_world["env"]},
                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        while not [r for r in hub_world["hub"].requests("get") if r["file"] == SHARD] and proc.poll() is None:
            time.sleep(0.05)  # until half the shard has gone out and the rest is held back
        os.kill(proc.pid, sig)
        err = proc.communicate(timeout=60)[1]
    finally:
        proc.kill()
        proc.wait()
        hub_world["hub"].released.set()
    assert proc.returncode == code, err
    if sig != signal.SIGKILL:
        assert err.splitlines() == [f"sparkstack: interrupted by {signal.Signals(sig).name} "
                                    "(outputs are published atomically: nothing half-written)"]
    hub_dir = hub_world["hf"] / "hub"
    assert not (hub_dir / MODEL_ENTRY).exists()
    assert list((hub_dir / ".sparkstack-fetch").rglob("*.incomplete"))  # huggingface_hub's temp file, left by the kill
    hub_world["hub"].faults.clear()
    assert fetch(run_cli, hub_world).returncode == 0
    assert snapshot_files(hub_world, MODEL_ENTRY, pinned) == files
    # Only the commit's blobs were published: no temp file came along.
    assert {p.name for p in (hub_dir / MODEL_ENTRY / "blobs").iterdir()} == {blob_name(k, v) for k, v in files.items()}
    assert not (hub_dir / ".sparkstack-fetch").exists()


def test_bytes_that_do_not_hash_to_their_name_are_never_published(run_cli, hub_world):
    pinned = hub_world["pinned"][MODEL]
    good = hub_world["repos"][MODEL].commits[pinned][SHARD]
    hub_world["hub"].faults["corrupt"] = SHARD
    line = one_error_line(fetch(run_cli, hub_world))
    assert SHARD in line and f"does not hash to its sha256 {hashlib.sha256(good).hexdigest()}" in line
    assert not (hub_world["hf"] / "hub" / MODEL_ENTRY).exists()
    staged = list((hub_world["hf"] / "hub").rglob(hashlib.sha256(good).hexdigest()))
    assert staged == []  # the bad blob is gone from the stage too
    hub_world["hub"].faults.clear()
    assert fetch(run_cli, hub_world).returncode == 0
    assert snapshot_files(hub_world, MODEL_ENTRY, pinned)[SHARD] == good


def test_an_unknown_revision_and_a_dead_hub_each_give_one_line(run_cli, hub_world):
    ghost = "0" * 40
    recipe = recipe_copy(hub_world["tmp"] / "ghost.toml", ghost, hub_world["pinned"][DRAFTER])
    pinned = recipe_copy(hub_world["tmp"] / "recipe.toml", *hub_world["pinned"].values())
    unpinned = recipe_copy(hub_world["tmp"] / "unpinned.toml")
    before = tree(hub_world["tmp"])
    line = one_error_line(fetch(run_cli, hub_world, recipe=recipe))
    assert f"{MODEL}@{ghost}: the hub at {hub_world['hub'].url} has no such revision" in line
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"  # bound, never listening: connection refused
        line = one_error_line(fetch(run_cli, hub_world, env={"HF_ENDPOINT": dead}, recipe=pinned))
        assert f"cannot reach the hub at {dead}" in line
        line = one_error_line(fetch(run_cli, hub_world, "--resolve", env={"HF_ENDPOINT": dead}, recipe=unpinned))
        assert f"{MODEL}@main: cannot reach the hub at {dead}" in line
    assert tree(hub_world["tmp"]) == before  # no recipe written, nothing staged, no cache


def test_hf_token_reaches_the_hub_as_a_bearer_header(run_cli, hub_world):
    hub_world["hub"].token = "hf_sekret"
    line = one_error_line(fetch(run_cli, hub_world))
    assert "private" in line and "HF_TOKEN" in line
    hub_world["hub"].log.clear()
    proc = fetch(run_cli, hub_world, env={"HF_TOKEN": "hf_sekret"})
    assert proc.returncode == 0, proc.stderr
    seen = hub_world["hub"].requests()
    assert seen and {r["headers"].get("authorization") for r in seen} == {"Bearer hf_sekret"}
    assert "hf_sekret" not in proc.stdout + proc.stderr


def test_dry_run_says_what_it_would_do_and_writes_nothing(run_cli, hub_world):
    recipe = recipe_copy(hub_world["tmp"] / "mine.toml")
    before = tree(hub_world["tmp"])
    proc = fetch(run_cli, hub_world, "--resolve", "--dry-run", recipe=recipe)
    assert proc.returncode == 0, proc.stderr
    assert f"would pin model_revision = {hub_world['pinned'][MODEL]}" in proc.stdout
    proc = fetch(run_cli, hub_world, "--dry-run", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    want = {MODEL: hub_world["repos"][MODEL].commits[hub_world["pinned"][MODEL]],
            DRAFTER: hub_world["repos"][DRAFTER].commits[hub_world["pinned"][DRAFTER]]}
    for e in doc["entries"]:
        assert e["revision"] == hub_world["pinned"][e["repo"]] and not e["up_to_date"]
        assert sorted(f["file"] for f in e["to_download"]) == sorted(want[e["repo"]])
        assert e["bytes_to_download"] == sum(len(b) for b in want[e["repo"]].values())
    assert {k for k in tree(hub_world["tmp"]) if k not in before} == {str(hub_world["tmp"] / "recipe.toml")}
    assert recipe.read_text() == before[str(recipe)].decode()
    assert hub_world["hub"].requests("head") == hub_world["hub"].requests("get") == []  # only model_info was asked


def test_unpinned_entries_are_refused_naming_resolve(run_cli, hub_world):
    recipe = recipe_copy(hub_world["tmp"] / "half.toml", hub_world["pinned"][MODEL])
    line = one_error_line(fetch(run_cli, hub_world, recipe=recipe))
    assert "[drafter] revision unpinned" in line and f"sparkstack fetch --resolve --recipe {recipe}" in line
    assert hub_world["hub"].requests() == [] and not hub_world["hf"].exists()


def test_a_new_commit_downloads_only_what_changed(run_cli, hub_world):
    """Blobs the entry holds for the old commit are linked into the new snapshot, not downloaded again."""
    assert fetch(run_cli, hub_world).returncode == 0
    repo = hub_world["repos"][MODEL]
    files = dict(repo.commits[hub_world["pinned"][MODEL]])
    files["config.json"] = b'{"num_hidden_layers": 3, "new": 1}\n'
    new = repo.commit(files)
    hub_world["hub"].log.clear()
    proc = fetch(run_cli, hub_world, recipe=recipe_copy(hub_world["tmp"] / "new.toml", new, hub_world["pinned"][DRAFTER]))
    assert proc.returncode == 0, proc.stderr
    assert [r["file"] for r in hub_world["hub"].downloads()] == ["config.json"]
    assert snapshot_files(hub_world, MODEL_ENTRY, new) == files
    assert snapshot_files(hub_world, MODEL_ENTRY, hub_world["pinned"][MODEL]) == repo.commits[hub_world["pinned"][MODEL]]
    assert (hub_world["hf"] / "hub" / MODEL_ENTRY / "refs/main").read_text() == new
    # Rewritten in place, refs/main and the new listing read like the files beside them (umask applies).
    umask = os.umask(0)
    os.umask(umask)
    for rewritten in ("refs/main", f".sparkstack/listing-{new}.json"):
        assert (hub_world["hf"] / "hub" / MODEL_ENTRY / rewritten).stat().st_mode & 0o777 == 0o666 & ~umask, rewritten


def test_a_file_the_user_added_to_the_snapshot_is_never_lost(run_cli, hub_world):
    """Publishing swaps the snapshot dir whole: a file that is not the commit's is refused, not dropped."""
    assert fetch(run_cli, hub_world).returncode == 0
    snap = hub_world["hf"] / "hub" / MODEL_ENTRY / "snapshots" / hub_world["pinned"][MODEL]
    (snap / "notes").mkdir()
    (snap / "notes" / "mine.txt").write_text("keep me")
    (snap / "config.json").unlink()  # so the snapshot needs publishing again
    line = one_error_line(fetch(run_cli, hub_world))
    assert f"{snap / 'notes' / 'mine.txt'}: not a file of {MODEL}@{hub_world['pinned'][MODEL]}" in line
    assert (snap / "notes" / "mine.txt").read_text() == "keep me"


def test_hf_hub_cache_elsewhere_is_named_and_the_hub_launch_mounts_is_used(run_cli, hub_world):
    elsewhere = hub_world["tmp"] / "elsewhere"
    proc = fetch(run_cli, hub_world, "--dry-run", "--json", env={"HF_HUB_CACHE": str(elsewhere)})
    assert proc.returncode == 0, proc.stderr
    assert f"HF_HUB_CACHE={elsewhere} is ignored: fetch writes to {hub_world['hf'] / 'hub'}" in proc.stderr
    assert json.loads(proc.stdout)["hub"] == str(hub_world["hf"] / "hub")


def test_refs_main_moved_away_locally_is_put_back_without_a_download(run_cli, hub_world):
    """The entry holds every file of the pinned commit, but refs/main names another commit (a `hf download` of
    another revision moved it): strip and ship follow refs/main, so fetch is not up to date until it names the pin."""
    pinned = hub_world["pinned"][MODEL]
    assert fetch(run_cli, hub_world).returncode == 0
    ref = hub_world["hf"] / "hub" / MODEL_ENTRY / "refs" / "main"
    other = "0" * 40
    ref.write_text(other)
    plan = json.loads(fetch(run_cli, hub_world, "--dry-run", "--json").stdout)
    (model,) = [e for e in plan["entries"] if e["label"] == "model"]
    assert model["up_to_date"] is False and model["ref_main"] == other and model["to_download"] == []
    hub_world["hub"].log.clear()
    proc = fetch(run_cli, hub_world, "--json")
    assert proc.returncode == 0, proc.stderr
    (result,) = [r for r in json.loads(proc.stdout)["results"] if r["label"] == "model"]
    assert result["up_to_date"] is False and result["downloaded"] == 0
    assert ref.read_text() == pinned
    assert hub_world["hub"].downloads() == []  # every blob was there: nothing crossed
