"""fetch against a hostile or broken hub, and a bad command line: one line each, nothing written."""

import hashlib
import json

import pytest
from hub_standin import DRAFTER, MODEL, HubStandin, recipe_copy
from clirun import one_error_line


def pinned(w, name="recipe.toml"):
    return recipe_copy(w["tmp"] / name, w["repos"][MODEL].refs["main"], w["repos"][DRAFTER].refs["main"])


@pytest.mark.parametrize("bad_path", ["../../outside.json", "/etc/evil", "a//b.json", "./c.json", "d/../../e.json"])
def test_a_listed_path_outside_the_snapshot_is_refused(run_cli, hub_world, bad_path):
    repo = hub_world["repos"][MODEL]
    files = dict(repo.commits[repo.refs["main"]])
    files[bad_path] = b"{}"
    repo.commit(files)
    line = one_error_line(run_cli("fetch", "--recipe", pinned(hub_world), env=hub_world["env"]))
    assert "which would land outside the snapshot" in line
    assert hub_world["hub"].requests("get") == [] and not (hub_world["tmp"] / "hf").exists()


def tree(root) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize("escape", ["absolute", "relative"])
def test_a_blob_name_that_is_a_path_is_refused_before_anything_is_written(run_cli, hub_world, escape):
    """huggingface_hub joins the HEAD's ETag into the blob path unchecked: a hostile hub could write anywhere."""
    target = hub_world["tmp"] / "outside" / "PWNED"
    etag = str(target) if escape == "absolute" else "../" * 40 + str(target).lstrip("/")
    hub_world["hub"].faults["etag"] = etag
    recipe = pinned(hub_world)
    before = tree(hub_world["tmp"])
    line = one_error_line(run_cli("fetch", "--recipe", recipe, env=hub_world["env"]))
    assert "names its blob" in line and "nothing written" in line
    assert not (hub_world["tmp"] / "outside").exists()
    assert {p for p in tree(hub_world["tmp"]) - before if not p.startswith("hf")} == set()
    assert hub_world["hub"].requests("get") == []  # refused at the HEAD: no body was asked for


def test_a_body_longer_than_the_listed_size_is_cut_off_at_the_listed_size(run_cli, hub_world):
    """The stand-in sends the shard and 16 MiB more, then holds the connection: the fetch stops on its own."""
    shard = "model-00002-of-00003.safetensors"
    data = hub_world["repos"][MODEL].commits[hub_world["repos"][MODEL].refs["main"]][shard]
    size = len(data)
    hub_world["hub"].faults["oversize"] = shard
    try:
        line = one_error_line(run_cli("fetch", "--recipe", pinned(hub_world),
                                env={**hub_world["env"], "HF_HUB_DOWNLOAD_TIMEOUT": "3"}))
    finally:
        hub_world["hub"].released.set()
    assert f"{shard}: {hub_world['hub'].url} sent more than the {size} bytes the hub lists" in line
    assert list((hub_world["tmp"] / "hf").rglob(hashlib.sha256(data).hexdigest() + "*")) == []  # nor its partial file
    assert not (hub_world["tmp"] / "hf" / "hub" / "models--LibertAIDAI--GLM-5.3-Flash-NVFP4").exists()


@pytest.mark.parametrize("name, value", [("HF_ENDPOINT", "http://[::1"), ("HF_ENDPOINT", "127.0.0.1:8080"),
                                         ("HF_HUB_DOWNLOAD_TIMEOUT", "abc"), ("HF_HUB_ETAG_TIMEOUT", "1.5")])
def test_a_bad_hub_setting_is_one_line_naming_it(run_cli, hub_world, name, value):
    recipe = recipe_copy(hub_world["tmp"] / "mine.toml")
    line = one_error_line(run_cli("fetch", "--recipe", recipe, "--resolve", env={**hub_world["env"], name: value}))
    assert f"{name}={value!r}" in line
    assert hub_world["hub"].requests() == []


def test_a_failing_cdn_is_named_not_blamed_on_the_hub(run_cli, hub_world):
    with HubStandin({}) as cdn:
        cdn.faults["status"] = "500"
        hub_world["hub"].faults["redirect"] = cdn.url
        line = one_error_line(run_cli("fetch", "--recipe", pinned(hub_world), env=hub_world["env"]))
        assert f"{cdn.url} (where the hub at {hub_world['hub'].url} sent it) answered HTTP 500" in line
        assert [r["path"].startswith("/cdn/") for r in cdn.requests()] == [True] * len(cdn.requests()) != []


def test_a_local_value_error_is_not_blamed_on_the_hub(hub_world, monkeypatch):
    """huggingface_hub raises ValueError for its own limits too (a file over 50 GB without hf_xet)."""
    from sparkstack.errors import SparkstackError
    from sparkstack.fetch.hub import hub_errors

    monkeypatch.setenv("HF_ENDPOINT", hub_world["hub"].url)
    with pytest.raises(SparkstackError) as local, hub_errors("org/name@rev"):
        raise ValueError("The file is too large to be downloaded using the regular download method.")
    assert str(local.value) == "org/name@rev: The file is too large to be downloaded using the regular download method."
    with pytest.raises(SparkstackError) as garbled, hub_errors("org/name@rev"):
        json.loads("<html>")
    assert "gave an answer that makes no sense" in str(garbled.value)


def test_a_hub_answering_for_another_commit_is_refused(run_cli, hub_world):
    hub_world["hub"].faults["info_sha"] = "1" * 40
    line = one_error_line(run_cli("fetch", "--recipe", pinned(hub_world), env=hub_world["env"]))
    assert f"answered for commit '{'1' * 40}' instead" in line
    assert not (hub_world["tmp"] / "hf").exists()


@pytest.mark.parametrize("sha", ["main", "A" * 40, "", "0" * 39])
def test_resolve_refuses_an_answer_that_is_not_a_commit(run_cli, hub_world, sha):
    hub_world["hub"].faults["info_sha"] = sha
    recipe = recipe_copy(hub_world["tmp"] / "mine.toml")
    before = recipe.read_bytes()
    line = one_error_line(run_cli("fetch", "--recipe", recipe, "--resolve", env=hub_world["env"]))
    assert "named no commit hash" in line
    assert recipe.read_bytes() == before


def test_an_unknown_repo_is_one_line(run_cli, hub_world):
    del hub_world["repos"][DRAFTER]
    line = one_error_line(run_cli("fetch", "--recipe", recipe_copy(hub_world["tmp"] / "mine.toml"), "--resolve", env=hub_world["env"]))
    assert f"{DRAFTER}@main: no such repo" in line


def test_offline_mode_is_named(run_cli, hub_world):
    line = one_error_line(run_cli("fetch", "--recipe", pinned(hub_world), env={**hub_world["env"], "HF_HUB_OFFLINE": "1"}))
    assert "HF_HUB_OFFLINE is set" in line


def test_a_bad_revision_in_the_recipe_is_refused_before_the_hub_is_asked(run_cli, hub_world):
    recipe = recipe_copy(hub_world["tmp"] / "mine.toml")
    recipe.write_text(recipe.read_text().replace('model_revision = "unpinned"', 'model_revision = "HEAD"'))
    line = one_error_line(run_cli("fetch", "--recipe", recipe, "--resolve", env=hub_world["env"]))
    assert "model_revision='HEAD' is neither" in line and hub_world["hub"].requests() == []


def test_bad_command_lines_are_usage_errors(run_cli, hub_world):
    one_error_line(run_cli("fetch", "--resolv", env=hub_world["env"]), code=2)
    one_error_line(run_cli("fetch", "extra-arg", env=hub_world["env"]), code=2)
    line = one_error_line(run_cli("fetch", "--recipe", hub_world["tmp"] / "nope.toml", env=hub_world["env"]))
    assert "no such recipe file" in line
