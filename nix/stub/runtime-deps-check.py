"""The stub's stand-in for nixpkgs' pythonRuntimeDepsCheckHook (its behaviour read from nixpkgs' hook).

Reads the built wheel's METADATA and, for every Requires-Dist whose marker holds here (so `extra == ...`
requirements are skipped, as nixpkgs skips them), checks that the distribution is installed and that its
version is inside the specifier (pre-releases allowed, as nixpkgs allows them). Names given with
--relax have their versions unchecked (nixpkgs' pythonRelaxDeps rewrites them out of the wheel).
Every unmet requirement is one line on stderr naming the package being built, the requirement and the
version found; any such line makes the exit status 1.

    python runtime-deps-check.py WHEEL [--relax NAME ...]
"""

import argparse
import re
import sys
import zipfile
from email.parser import Parser
from importlib import metadata

from packaging.requirements import Requirement


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("wheel")
    parser.add_argument("--relax", nargs="*", default=[])
    args = parser.parse_args()
    relaxed = {norm(n) for n in args.relax}
    with zipfile.ZipFile(args.wheel) as whl:
        names = [n for n in whl.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1]
        if len(names) != 1:
            print(f"nix/stub: {args.wheel}: no single .dist-info/METADATA in the wheel", file=sys.stderr)
            return 1
        meta = Parser().parsestr(whl.read(names[0]).decode("utf-8"))
    built = f"{meta['Name']} {meta['Version']}"
    failed = 0
    for text in meta.get_all("Requires-Dist") or []:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = norm(req.name)
        try:
            version = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            print(f"nix/stub: {built}: runtime dependency {name}{req.specifier} is not installed "
                  "(nixpkgs' pythonRuntimeDepsCheckHook fails here too)", file=sys.stderr)
            failed += 1
            continue
        if name not in relaxed and req.specifier and not req.specifier.contains(version, prereleases=True):
            print(f"nix/stub: {built}: runtime dependency {name}{req.specifier} not satisfied by version {version} "
                  "(nixpkgs' pythonRuntimeDepsCheckHook fails here too)", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
