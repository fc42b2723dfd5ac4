"""--overlay-src in every shape the blog or upstream gives: a checkout, the blog's working directory (root or
files/), and its bundle (tar, tar.gz, zip; with or without one top-level dir), through one resolver."""

import hashlib
import io
import json
import shutil
import tarfile
import zipfile
from pathlib import Path

import pytest

import imagefix as fx
from sparkstack.errors import SparkstackError
from sparkstack.patch import source
from sparkstack.patch.overlay import load_overlay
from clirun import one_error_line

REPO = Path(__file__).parents[2]
BLOG_BUNDLE_SHA = "2d5931db561d58c22bb8dca60a1a45e41905e1e4d11d7cafd44cd950ef41eb94"
DISABLED_SCRIPT = "patch_prefix_cache_draft_group.py"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def blog_dir(root: Path, files: dict[str, str] | None = None) -> Path:
    """glm5.3-flash-spark/ as Step 5 lays it out: tony-lane/Dockerfile and files/overlay-dflash2/, stand-in contents.
    The disabled step's script is absent, as in the blog."""
    work = root / "glm5.3-flash-spark"
    (work / "tony-lane").mkdir(parents=True)
    (work / "tony-lane/Dockerfile").write_text("FROM radixark/vllm-glm53-flash:sm121-v8\nCOPY files/overlay-dflash2/ /opt/dflash2/\n")
    files = files if files is not None else {**fx.FIXTURE_SCRIPTS, **fx.OVERLAY_FILES}
    for name, text in files.items():
        if name == DISABLED_SCRIPT:
            continue
        p = work / "files/overlay-dflash2" / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return work


def pin_bundle_hash(overlay_dir: Path, bundle_sha: str) -> None:
    """A test-only bundle pin, in a tmp overlay.toml (the real one keeps the blog's)."""
    toml = overlay_dir / "overlay.toml"
    text = toml.read_text()
    toml.write_text(text.replace('subdir = "overlay-dflash2"\n',
                                 f'subdir = "overlay-dflash2"\nbundle_sha256 = "{bundle_sha}"\n', 1))


@pytest.fixture
def unpinned_overlay(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKSTACK_CACHE_DIR", str(tmp_path / "cache"))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))  # where a bundle is unpacked: must be empty after every run
    base = tmp_path / "base"
    fx.write_base(base)
    overlay = fx.write_overlay(tmp_path / "overlay")  # every hash unpinned
    return {"tmp": tmp_path, "base": base, "overlay": overlay, "scratch": scratch}


def build(run_cli, w, src, out, check=0):
    proc = run_cli("image", "build", "--base", w["base"], "--overlay", w["overlay"], "--overlay-src", src,
                   "--out", out, "--json", check=check)
    return json.loads(proc.stdout)["result"] if check == 0 else proc


@pytest.mark.parametrize("given", ["root", "files"])
def test_blog_working_dir_pins_and_builds_without_allow_unpinned(unpinned_overlay, run_cli, given):
    work = blog_dir(unpinned_overlay["tmp"])
    src = work if given == "root" else work / "files"
    proc = run_cli("pin", "overlay", "--overlay", unpinned_overlay["overlay"], "--overlay-src", src, check=0)
    # Each file's sha256, as sha256sum prints it, computed here from the files themselves.
    for p in sorted((work / "files/overlay-dflash2").rglob("*.py")):
        rel = p.relative_to(work / "files/overlay-dflash2").as_posix()
        assert f"{sha(p.read_bytes())}  {rel}" in proc.stdout.splitlines()
    assert DISABLED_SCRIPT not in proc.stdout
    assert load_overlay(unpinned_overlay["overlay"]).unpinned == ()
    result = build(run_cli, unpinned_overlay, src, unpinned_overlay["tmp"] / "out")
    assert result["manifest_digest"].startswith("sha256:")
    assert list(unpinned_overlay["scratch"].iterdir()) == []


def test_checkout_layout_still_resolves(unpinned_overlay, run_cli):
    checkout = fx.write_overlay_source(unpinned_overlay["tmp"] / "checkout")
    run_cli("pin", "overlay", "--overlay", unpinned_overlay["overlay"], "--overlay-src", checkout, check=0)
    assert load_overlay(unpinned_overlay["overlay"]).unpinned == ()
    # The checkout also has the disabled step's script: it is pinned too.
    assert load_overlay(unpinned_overlay["overlay"]).steps[3].script.sha256 == sha(fx.FIXTURE_SCRIPTS[DISABLED_SCRIPT].encode())


def test_a_checkout_at_another_rev_than_overlay_toml_says_so(unpinned_overlay, run_cli):
    """The docs tell users to check out overlay.toml's rev; a checkout at another commit is named (its files, which
    the hashes judge, are still what is pinned)."""
    import subprocess

    checkout = fx.write_overlay_source(unpinned_overlay["tmp"] / "checkout")
    git = ["git", "-C", str(checkout), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git[:3] + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "-A"], check=True)
    subprocess.run(git + ["commit", "-q", "-m", "fixture"], check=True)
    head = subprocess.run(git[:3] + ["rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    rev = load_overlay(unpinned_overlay["overlay"]).rev
    proc = run_cli("pin", "overlay", "--overlay", unpinned_overlay["overlay"], "--overlay-src", checkout, "--dry-run", check=0)
    (note,) = [line for line in proc.stdout.splitlines() if line.startswith("note: ")]
    assert f"git checkout at {head[:12]}, not overlay.toml's rev {rev[:12]}" in note and f"checkout {rev}" in note
    doc = json.loads(run_cli("pin", "overlay", "--overlay", unpinned_overlay["overlay"], "--overlay-src", checkout, "--dry-run",
                             "--json", check=0).stdout)
    assert len(doc["notes"]) == 1
    plain = fx.write_overlay_source(unpinned_overlay["tmp"] / "plain")  # no .git: nothing to say
    assert "note:" not in run_cli("pin", "overlay", "--overlay", unpinned_overlay["overlay"], "--overlay-src", plain,
                                  "--dry-run", check=0).stdout


def test_real_overlay_copy_pins_a_blog_dir_and_refuses_its_bundle_by_hash(unpinned_overlay, run_cli):
    overlay = unpinned_overlay["tmp"] / "real-overlay"
    shutil.copytree(REPO / "overlays/dflash2", overlay)
    real = load_overlay(overlay)
    assert real.bundle_sha256 == BLOG_BUNDLE_SHA
    stand_in = {f.path: f"# stand-in for {f.path}\n" for f in source.source_files(real, real.steps)}
    work = blog_dir(unpinned_overlay["tmp"], stand_in)
    run_cli("pin", "overlay", "--overlay", overlay, "--overlay-src", work, check=0)
    pinned = load_overlay(overlay)
    assert pinned.unpinned == ()
    assert pinned.installs[0].file.sha256 == sha(stand_in[pinned.installs[0].file.path].encode())
    before = (overlay / "overlay.toml").read_bytes()

    bundle = fx.make_bundle(work, unpinned_overlay["tmp"] / "glm5.3-flash-spark.tar.gz", "tar.gz", True)
    for argv in (("pin", "overlay", "--overlay", overlay), ("image", "build", "--base", unpinned_overlay["base"], "--overlay",
                                                             overlay, "--out", unpinned_overlay["tmp"] / "out")):
        line = one_error_line(run_cli(*argv, "--overlay-src", bundle))
        assert sha(bundle.read_bytes()) in line and BLOG_BUNDLE_SHA in line
        assert (overlay / "overlay.toml").read_bytes() == before
        assert not (unpinned_overlay["tmp"] / "out").exists() and list(unpinned_overlay["scratch"].iterdir()) == []


@pytest.mark.parametrize("kind", ["tar", "tar.gz", "zip"])
@pytest.mark.parametrize("top", [True, False], ids=["top-dir", "flat"])
def test_pinned_test_bundle_builds_the_same_image_as_its_dir(unpinned_overlay, run_cli, kind, top):
    work = blog_dir(unpinned_overlay["tmp"])
    bundle = fx.make_bundle(work, unpinned_overlay["tmp"] / f"bundle.{kind}", kind, top)
    pin_bundle_hash(unpinned_overlay["overlay"], sha(bundle.read_bytes()))
    run_cli("pin", "overlay", "--overlay", unpinned_overlay["overlay"], "--overlay-src", bundle, check=0)
    assert load_overlay(unpinned_overlay["overlay"]).unpinned == ()
    from_dir = build(run_cli, unpinned_overlay, work, unpinned_overlay["tmp"] / "from-dir")
    from_bundle = build(run_cli, unpinned_overlay, bundle, unpinned_overlay["tmp"] / "from-bundle")
    assert from_bundle["manifest_digest"] == from_dir["manifest_digest"]
    assert (unpinned_overlay["tmp"] / "from-bundle/index.json").read_bytes() == (unpinned_overlay["tmp"] / "from-dir/index.json").read_bytes()
    assert list(unpinned_overlay["scratch"].iterdir()) == []


def test_differing_files_are_all_listed_with_both_hashes(unpinned_overlay, run_cli):
    work = blog_dir(unpinned_overlay["tmp"])
    run_cli("pin", "overlay", "--overlay", unpinned_overlay["overlay"], "--overlay-src", work, check=0)
    d = work / "files/overlay-dflash2"
    old = {n: sha((d / n).read_bytes()) for n in ("qwen3_dflash2.py", "patch_glm_aux_capture.py")}
    for n in old:
        (d / n).write_text("# changed\n")
    line = one_error_line(build(run_cli, unpinned_overlay, work, unpinned_overlay["tmp"] / "out", check=None))
    for n, pinned in old.items():
        assert f"{n}: sha256 {sha(b'# changed' + bytes([10]))} does not match the pinned {pinned}" in line
    assert "speculator.py" not in line and not (unpinned_overlay["tmp"] / "out").exists()


def tar_with(members: list[tarfile.TarInfo], data: dict[str, bytes] = {}) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for m in members:
            tar.addfile(m, io.BytesIO(data[m.name]) if m.name in data else None)
    return buf.getvalue()


def _info(name, type_=tarfile.REGTYPE, size=0, linkname=""):
    m = tarfile.TarInfo(name)
    m.type, m.size, m.linkname = type_, size, linkname
    return m


def _zip_with(name: str, data: bytes, mode: int | None = None) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        info = zipfile.ZipInfo(name)
        if mode is not None:
            info.external_attr = mode << 16
        zf.writestr(info, data)
    return buf.getvalue()


HOSTILE = {
    "dotdot": tar_with([_info("../evil.py", size=3)], {"../evil.py": b"bad"}),
    "absolute": tar_with([_info("/tmp/evil.py", size=3)], {"/tmp/evil.py": b"bad"}),
    "symlink-out": tar_with([_info("overlay-dflash2", tarfile.SYMTYPE, linkname="/etc")]),
    "hardlink": tar_with([_info("x", tarfile.LNKTYPE, linkname="/etc/passwd")]),
    "device": tar_with([_info("dev", tarfile.CHRTYPE)]),
    "fifo": tar_with([_info("fifo", tarfile.FIFOTYPE)]),
    "duplicate": tar_with([_info("a.py", size=1), _info("a.py", size=1)], {"a.py": b"x"}),
    "zip-dotdot": _zip_with("../../evil.py", b"bad"),
    "zip-symlink": _zip_with("overlay-dflash2", b"/etc", mode=0o120777),
    "not-an-archive": b"just some bytes, neither tar nor zip\n" * 20,
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_bundles_are_refused_and_leave_nothing(unpinned_overlay, run_cli, name):
    bundle = unpinned_overlay["tmp"] / f"hostile-{name}"
    bundle.write_bytes(HOSTILE[name])
    pin_bundle_hash(unpinned_overlay["overlay"], sha(HOSTILE[name]))  # the hash matches: the content is what is refused
    before = (unpinned_overlay["overlay"] / "overlay.toml").read_bytes()
    line = one_error_line(run_cli("pin", "overlay", "--overlay", unpinned_overlay["overlay"], "--overlay-src", bundle))
    assert str(bundle) in line and "sha256" not in line
    assert (unpinned_overlay["overlay"] / "overlay.toml").read_bytes() == before
    assert list(unpinned_overlay["scratch"].iterdir()) == []
    assert not (unpinned_overlay["tmp"] / "evil.py").exists()


def test_a_bomb_is_bounded_by_what_it_unpacks(unpinned_overlay, monkeypatch):
    monkeypatch.setattr(source, "MAX_BUNDLE_BYTES", 1 << 20)
    data = b"\0" * (4 << 20)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.addfile(_info("big.py", size=len(data)), io.BytesIO(data))
    bundle = unpinned_overlay["tmp"] / "bomb.tar.gz"
    bundle.write_bytes(buf.getvalue())
    assert bundle.stat().st_size < (1 << 20)
    pin_bundle_hash(unpinned_overlay["overlay"], sha(bundle.read_bytes()))
    with pytest.raises(SparkstackError, match="unpacks to more than 1048576 bytes"):
        with source.opened_source(load_overlay(unpinned_overlay["overlay"]), bundle):
            pass
    assert list(unpinned_overlay["scratch"].iterdir()) == []


def test_a_dir_holding_two_layouts_that_differ_is_refused_naming_both(unpinned_overlay, run_cli):
    """A checkout with the blog's files/ tree copied in: which of the two is pinned is the user's to say."""
    mixed = fx.write_overlay_source(unpinned_overlay["tmp"] / "mixed")  # the checkout's layout
    blog = blog_dir(unpinned_overlay["tmp"] / "blog")
    shutil.copytree(blog / "files", mixed / "files")  # the same files: one answer, no question
    run_cli("pin", "overlay", "--overlay", unpinned_overlay["overlay"], "--overlay-src", mixed, "--dry-run", check=0)
    name = next(p for p in fx.OVERLAY_FILES if p.endswith(".py"))
    (mixed / "files/overlay-dflash2" / name).write_text("# edited in the copy\n")
    line = one_error_line(run_cli("pin", "overlay", "--overlay", unpinned_overlay["overlay"], "--overlay-src", mixed))
    assert "holds the overlay's files in 2 layouts" in line and f"differ ({name}" in line, line
    assert str(mixed / "overlay-dflash2") in line and str(mixed / "files/overlay-dflash2") in line


def test_a_dir_with_no_overlay_layout_names_the_missing_file(unpinned_overlay, run_cli):
    empty = unpinned_overlay["tmp"] / "empty"
    empty.mkdir()
    line = one_error_line(run_cli("pin", "overlay", "--overlay", unpinned_overlay["overlay"], "--overlay-src", empty))
    assert "qwen3_dflash2.py is missing" in line
