"""Fixtures for the flake's checks, from the test fixture generators (checks/imagefix.py, checks/synth.py).

Run inside Nix derivations (nix/checks.nix) and by the tests. No network, no sparkstack code:

    python fixtures.py image OUT          OUT/base (OCI layout), OUT/src (overlay source), OUT/overlay (pinned overlay.toml)
    python fixtures.py pins LAYOUT        the pins (nix/pins.json's shape) of a layout, on stdout
    python fixtures.py checkpoint OUT     OUT/hub/models--LibertAIDAI--GLM-5.3-Flash-NVFP4 (with MTP tensors)
    python fixtures.py verify-strip ENTRY exit 1 unless ENTRY (a stripped cache entry) holds no MTP tensor

The image fixture is deterministic (no random filler, plain tar layers, fixed mtimes), so its digests
can be known before the build: nix/fixture-pins.json holds them (checks.image-fixture needs them at
evaluation time for its fixed-output derivations); `pins` rewrites that file, and a test keeps it current.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

CHECKS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(CHECKS))

import imagefix as fx  # noqa: E402

FIXTURE_REFERENCE = "fixture.invalid/sparkstack/fixture-base:1"  # never fetched: blobs come from `image`
OCI_INDEX = "application/vnd.oci.image.index.v1+json"


def write_image(out: Path) -> None:
    layers = fx.default_layers(filler_bytes=0, compressions=("none", "none", "none"))
    fx.write_base(out / "base", layers=layers, arch="arm64")
    src = fx.write_overlay_source(out / "src")
    fx.write_overlay(out / "overlay", pinned_from=src / "overlay-dflash2")


def pins_of(layout: Path, platform: str = "linux/arm64") -> dict:
    index = json.loads((layout / "index.json").read_text())
    entry = index["manifests"][0]
    manifest = fx.read_doc(layout, entry["digest"])

    def desc(d: dict) -> dict:
        return {"digest": d["digest"], "mediaType": d["mediaType"], "size": d["size"]}

    top = {"digest": entry["digest"], "mediaType": entry["mediaType"], "size": entry["size"]}
    return {"reference": FIXTURE_REFERENCE, "registry": "fixture.invalid", "repository": "sparkstack/fixture-base",
            "resolved": top,
            "platforms": {platform: {"manifest": top, "config": desc(manifest["config"]),
                                     "layers": [desc(l) for l in manifest["layers"]]}}}


def write_checkpoint(out: Path) -> Path:
    import synth

    flat = out / "flat"
    synth.write_model_dir(flat)
    entry = synth.cache_from_dir(flat, out / "hub")
    import shutil

    shutil.rmtree(flat)
    return entry


def verify_strip(entry: Path) -> list[str]:
    """Every tensor key left in the entry's current snapshot that is MTP (by the test author's own Spec list)."""
    import synth
    from safetensors import safe_open

    mtp = {s.name for shard in synth.DEFAULT_SHARDS.values() for s in shard if s.mtp}
    kept = {s.name for shard in synth.DEFAULT_SHARDS.values() for s in shard if not s.mtp}
    rev = (entry / "refs" / "main").read_text().strip()
    found = set()
    for f in sorted((entry / "snapshots" / rev).glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            found.update(st.keys())
    problems = [f"MTP tensor left: {k}" for k in sorted(found & mtp)]
    problems += [f"tensor lost: {k}" for k in sorted(kept - found)]
    return problems


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("image", "pins", "checkpoint", "verify-strip"):
        print(__doc__, file=sys.stderr)
        return 2
    what, path = argv[0], Path(argv[1])
    if what == "image":
        write_image(path)
    elif what == "pins":
        sys.stdout.write(json.dumps(pins_of(path), indent=2) + "\n")
    elif what == "checkpoint":
        print(write_checkpoint(path))
    else:
        problems = verify_strip(path)
        for p in problems:
            print(p, file=sys.stderr)
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
