"""Where the shipped overlays and recipes live, however sparkstack was installed.

The checkout's top-level `overlays/` and `recipes/` are the source of truth. The
package reaches them through `sparkstack/data/{overlays,recipes}`: symlinks in a
checkout (so an editable install sees edits at once), copied as package data into
a wheel or a Nix build. From inside a checkout its own dirs win, so an edited
recipe is used even by a non-editable install.
"""

from __future__ import annotations

import os
import site
import sysconfig
from pathlib import Path

from sparkstack.errors import SparkstackError

PACKAGE_DATA = Path(__file__).resolve().parent / "data"
DEFAULT_OVERLAY = "dflash2"


def checkout_root(start: Path | None = None) -> Path | None:
    """The sparkstack checkout holding `start` (default: the working directory), if any."""
    here = (start or Path.cwd()).absolute()
    for d in (here, *here.parents):
        if (d / "python" / "sparkstack").is_dir() and (d / "overlays").is_dir() and (d / "recipes").is_dir():
            return d
    return None


def shipped_dirs(kind: str) -> list[Path]:
    """Dirs to search for `kind` ("overlays" or "recipes"), best first."""
    dirs = []
    root = checkout_root()
    if root is not None:
        dirs.append(root / kind)
    if (PACKAGE_DATA / kind).is_dir():
        dirs.append(PACKAGE_DATA / kind)
    return dirs


def recipe_dirs() -> list[Path]:
    extra = os.environ.get("SPARKSTACK_RECIPES")
    return ([Path(extra)] if extra else []) + shipped_dirs("recipes")


def default_overlay_dir() -> Path:
    for base in shipped_dirs("overlays"):
        if (base / DEFAULT_OVERLAY / "overlay.toml").is_file():
            return base / DEFAULT_OVERLAY
    raise SparkstackError(f"no shipped overlay {DEFAULT_OVERLAY!r} found (looked in the checkout and the package); "
                          "pass --overlay DIR")


def installed_copy_root(path: Path) -> Path | None:
    """The install root (site-packages, the package's data dir, the Nix store) holding `path`, or None when it
    is a file of its own (a checkout's, a user's copy). An installed copy is never written in place."""
    # In a checkout, the package's data dirs are symlinks out of the package; resolved, a path still inside the
    # package's data dir is an installed copy, wherever the package was installed.
    roots = {PACKAGE_DATA, *(Path(p).resolve() for p in (sysconfig.get_path("purelib"), sysconfig.get_path("platlib")))}
    roots |= {Path(p).resolve() for p in site.getsitepackages()}
    roots.add(Path("/nix/store"))
    real = path.resolve()
    return next((root for root in sorted(roots) if real.is_relative_to(root)), None)
