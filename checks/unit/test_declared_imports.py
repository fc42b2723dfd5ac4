"""Every third-party module that sparkstack's code imports is a declared [project] dependency.

Walks every module under python/sparkstack (imports inside functions too), drops the standard library and
sparkstack itself, and maps each remaining top-level name to the distribution that provides it here
(importlib.metadata). nix/package.nix names the same list (checks/nix/test_flake_files.py keeps the two
equal), so an undeclared import fails here before it fails a user at run time.

One exception, named: fetch/hub.py imports the HTTP client of whichever huggingface_hub major is installed
(httpx for 1.x, which nixpkgs carries; httpx2 for 2.x). Those come with huggingface_hub, not with
sparkstack; the test holds that to the installed huggingface_hub's own requirements.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "python/sparkstack"
# module -> (the one file allowed to import it, the huggingface_hub major whose requirement it is)
VIA_HUGGINGFACE_HUB = {"httpx": ("fetch/hub.py", 1), "httpx2": ("fetch/hub.py", 2)}


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9._-]+", name).group(0)).lower()


def third_party_imports(package: Path) -> dict[str, set[str]]:
    """Top-level module name -> the files (relative to `package`) that import it, for non-stdlib modules."""
    found: dict[str, set[str]] = {}
    own = package.name
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top != own and top not in sys.stdlib_module_names:
                    found.setdefault(top, set()).add(path.relative_to(package).as_posix())
    return found


def undeclared(package: Path, declared: set[str]) -> list[str]:
    """One line per imported module that no declared distribution provides."""
    providers = metadata.packages_distributions()
    problems = []
    for module, files in sorted(third_party_imports(package).items()):
        if module in VIA_HUGGINGFACE_HUB and files == {VIA_HUGGINGFACE_HUB[module][0]}:
            continue
        dists = {norm(d) for d in providers.get(module, [])}
        if not dists & declared:
            problems.append(f"{module} (imported by {', '.join(sorted(files))}; provided by "
                            f"{', '.join(sorted(dists)) or 'nothing installed'}) is not a [project] dependency")
    return problems


def declared_dependencies() -> set[str]:
    return {norm(r) for r in tomllib.loads((ROOT / "python/pyproject.toml").read_text())["project"]["dependencies"]}


def test_every_third_party_import_is_declared():
    assert undeclared(PACKAGE, declared_dependencies()) == []


def test_the_walk_finds_an_undeclared_import_even_inside_a_function(tmp_path):
    pkg = tmp_path / "sparkstack"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("import json\nfrom sparkstack import sub\n")
    (pkg / "sub/__init__.py").write_text("def f():\n    import yaml\n    from rich.console import Console\n")
    assert third_party_imports(pkg) == {"yaml": {"sub/__init__.py"}, "rich": {"sub/__init__.py"}}
    problems = undeclared(pkg, {"rich"})
    assert len(problems) == 1 and problems[0].startswith("yaml (imported by sub/__init__.py;"), problems
    # The real package's declared list, less one it imports, fails too.
    assert any(p.startswith("zstandard ") for p in undeclared(PACKAGE, declared_dependencies() - {"zstandard"}))


def test_the_hub_transport_import_is_the_installed_huggingface_hubs_own_requirement():
    dist = metadata.distribution("huggingface_hub")
    major = int(dist.version.split(".")[0])
    wanted = [m for m, (_, for_major) in VIA_HUGGINGFACE_HUB.items() if for_major == min(major, 2)]
    requires = {norm(r) for r in dist.requires or [] if "extra ==" not in r}
    assert wanted and set(wanted) <= requires, (dist.version, sorted(requires))
    imported = third_party_imports(PACKAGE)
    for module, (file, _) in VIA_HUGGINGFACE_HUB.items():
        assert imported.get(module) == {file}, f"{module} is imported outside {file}: {imported.get(module)}"
