"""Structure the design asks for: no import cycle in sparkstack, and one owner for the HF cache layout."""

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "python" / "sparkstack"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}
LAZY_TARGET = re.compile(r"sparkstack(\.\w+)+:\w+")  # "module:NAME", a lazy import spelled as a string


def ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(2, len(parts))]


def imported(name: str, path: Path) -> set[str]:
    """Every sparkstack module `name` imports, at any depth of its code (function-level imports count too),
    plus the packages Python runs on the way (an import of a.b.c runs a.b's __init__ first)."""
    found = set()
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text())):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_package else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and LAZY_TARGET.fullmatch(node.value):
            targets = [node.value.partition(":")[0]]  # cli's lazy commands: imported by name, on first use
        for t in targets:
            if t in MODULES:
                found.add(t)
                found.update(a for a in ancestors(t) if a in MODULES)
    own = set(ancestors(name)) | {name}
    return {m for m in found if m not in own}


def test_no_import_cycle():
    graph = {name: imported(name, path) for name, path in MODULES.items()}
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycle = stack[stack.index(nxt):] + [nxt]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name)
    assert "sparkstack.oci.source" in graph and graph["sparkstack.strip.plan"], "the import graph was not read"


def test_only_hfcache_knows_the_cache_layout():
    """refs/ and snapshots/ of a hub cache entry are spelled out in hfcache alone (OCI layouts have blobs/ too)."""
    offenders = []
    for name, path in MODULES.items():
        if name.startswith("sparkstack.hfcache"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in ("refs", "refs/main", "snapshots"):
                offenders.append(f"{name}:{node.lineno} {node.value!r}")
    assert offenders == []


# Path spellings of the hub cache layout: an entry's name, a snapshot under it, its ref file. Prose may name
# refs/main ("refs/main -> ..."); a path joins it with a slash.
LAYOUT_SPELLINGS = ("models--", "/snapshots/", "/refs/main")


def test_only_hfcache_spells_cache_paths_in_fstrings():
    """An f-string (or a string glued to one) that builds a hub path outside hfcache: models--ORG--NAME,
    .../snapshots/<rev> or .../refs/main. Those go through hfcache (entry_name, snapshot_text, ref_file)."""
    offenders = []
    for name, path in MODULES.items():
        if name.startswith("sparkstack.hfcache"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            parts = []
            if isinstance(node, ast.JoinedStr):
                parts = [v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str)]
            elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
                parts = [s.value for s in (node.left, node.right) if isinstance(s, ast.Constant) and isinstance(s.value, str)]
            for text in parts:
                for spelled in LAYOUT_SPELLINGS:
                    if spelled in text:
                        offenders.append(f"{name}:{node.lineno} {text!r}")
    assert offenders == []


def package_of(module: str) -> str:
    """sparkstack.launch.plan -> launch; sparkstack.units -> units."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def package_graph() -> dict[str, set[str]]:
    """Which area imports which, from every module's imports (function-level ones too)."""
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        graph.setdefault(package_of(name), set()).update(
            package_of(m) for m in imported(name, path) if package_of(m) != package_of(name))
    return graph


def floors(graph: dict[str, set[str]]) -> dict[str, int]:
    """Each area's floor, derived from the imports: one above the highest area it imports (0: imports none).
    Fails naming the circle when areas import each other round a loop."""
    floor: dict[str, int] = {}

    def visit(area: str, path: tuple[str, ...]) -> int:
        if area in path:
            raise AssertionError("areas import each other: " + " -> ".join(path[path.index(area):] + (area,)))
        if area not in floor:
            floor[area] = 1 + max((visit(d, path + (area,)) for d in graph[area]), default=-1)
        return floor[area]

    for area in sorted(graph):
        visit(area, ())
    return floor


# The deployment's floor: above recipe and hfcache, below every command that acts on the ranks. tune stands
# below launch (launch's preflight, guard and --drop-caches read tune.facts and tune.pagecache).
LOWER = ("recipe", "hfcache", "deploy", "tune")
HIGHER = ("launch", "cli", "ship", "fetch", "soak", "top", "up")


def test_areas_stand_on_floors_no_import_runs_up():
    graph = package_graph()
    floor = floors(graph)  # the area graph is a DAG
    up = sorted(f"{low} imports {high}" for low in LOWER for high in HIGHER if high in graph[low])
    assert up == []
    assert floor["recipe"] < floor["deploy"] and floor["hfcache"] < floor["deploy"]
    assert all(floor["deploy"] < floor[a] for a in ("launch", "tune", "ship", "fetch", "soak", "top"))
    assert floor["tune"] < floor["launch"]
    # none of the commands that take a Deployment imports launch for it
    for area in ("tune", "ship", "fetch"):
        assert "launch" not in graph[area], f"{area} imports launch"


# The commands up composes: each stands below it, and nothing but cli stands above it.
STAGE_AREAS = ("fetch", "strip", "image", "ship", "tune", "launch", "verify", "bench")


def test_up_composes_the_stage_commands_from_above_and_nothing_imports_it_but_cli():
    graph = package_graph()
    floor = floors(graph)
    assert all(floor[a] < floor["up"] for a in STAGE_AREAS), {a: floor[a] for a in (*STAGE_AREAS, "up")}
    assert sorted(a for a, deps in graph.items() if "up" in deps) == ["cli"]
    assert floor["up"] < floor["cli"]


def test_the_command_floor_stands_below_every_area_that_declares_a_command():
    """sparkstack.command (requests, views, summaries) imports only the floor-0 modules: every area may use it."""
    graph = package_graph()
    assert graph["command"] <= {"errors", "text"}, graph["command"]
    declaring = sorted(p.parent.name for p in PACKAGE.glob("*/command.py"))
    assert declaring and all("command" in graph[a] for a in declaring), declaring


ARCHITECTURE = PACKAGE.parents[1] / "docs" / "ARCHITECTURE.md"
FLOOR_ROW = re.compile(r"\| (\d+) \| ([^|]+) \| ([^|]+) \|")


def floor_table() -> dict[str, tuple[int, str]]:
    """ARCHITECTURE.md's floor table: each area it names (`cli.py` -> cli, `sweep/` -> sweep) -> its floor as
    written, and what the row says it imports."""
    section = ARCHITECTURE.read_text().split("## Floors", 1)[1].split("\n## ", 1)[0]
    table = {}
    for line in section.splitlines():
        row = FLOOR_ROW.match(line)
        if row:
            for area in re.findall(r"`(\w+)(?:\.py|/)`", row[2]):
                table[area] = (int(row[1]), row[3])
    return table


def test_the_floor_table_in_architecture_md_is_the_one_the_imports_give():
    """Each area's floor and the areas its row names are what the imports make them (the package's __init__,
    `__version__` only, is left out, as the page says). A new import, or an area moved, fails until the table
    says it."""
    graph = package_graph()
    floor = floors(graph)
    areas = set(graph) - {"sparkstack"}
    table = floor_table()
    assert set(table) == areas, f"areas the table lacks: {areas - set(table)}; it names: {set(table) - areas}"
    wrong = {a: (table[a][0], floor[a]) for a in areas if table[a][0] != floor[a]}
    assert wrong == {}, f"(written, derived) floors: {wrong}"
    declaring = {p.parent.name for p in PACKAGE.glob("*/command.py")}
    for area in sorted(areas):
        said = {b for b in areas if b != area and re.search(rf"(?<![\w.]){b}(?!\w)", table[area][1])}
        if "each area's `command` module" in table[area][1]:
            said |= declaring
        imports = graph[area] - {"sparkstack"}
        assert said == imports, f"{area}: the table names {sorted(said - imports)} it does not import, " \
                                f"and not {sorted(imports - said)} it does"


BINARY_UNITS = re.compile(r"\b(KiB|MiB|GiB|TiB)\b")


def test_one_formatter_picks_a_byte_counts_unit():
    """units.human_bytes is the one function that chooses among KiB, MiB, GiB and TiB: a function anywhere else
    whose strings name two of them is a second unit ladder (a fixed "GiB" beside a limit is not)."""
    offenders = []
    for name, path in MODULES.items():
        for fn in ast.walk(ast.parse(path.read_text())):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            units = {u for node in ast.walk(fn) if isinstance(node, ast.Constant) and isinstance(node.value, str)
                     for u in BINARY_UNITS.findall(node.value)}
            if len(units) > 1:
                offenders.append(f"{name}.{fn.name}: {sorted(units)}")
    assert offenders == ["sparkstack.units.human_bytes: ['GiB', 'KiB', 'MiB', 'TiB']"]


ENGINE_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def test_deploy_writes_no_engine_flag_and_reads_only_the_recipe_value_defaults():
    """The argv is launch's. deploy names only sparkstack's own --image and the generated flags whose value a plain
    recipe may set in its args (RECIPE_VALUE_DEFAULTS), and those are generated flags of launch's."""
    from sparkstack.deploy.plan import RECIPE_VALUE_DEFAULTS
    from sparkstack.launch.plan import GENERATED_FLAGS

    named = set()
    for name, path in MODULES.items():
        if name.startswith("sparkstack.deploy"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    named.update(ENGINE_FLAG.findall(node.value))
    assert named - {"--image"} == set(RECIPE_VALUE_DEFAULTS), named
    assert set(RECIPE_VALUE_DEFAULTS) <= set(GENERATED_FLAGS)


APPS_NIX = PACKAGE.parents[1] / "nix" / "apps.nix"
NO_APP = {"patch"}  # patch check has no app of its own (ARCHITECTURE.md says so)


def test_every_top_level_command_but_patch_has_one_app_in_apps_nix():
    """nix/apps.nix read as text (checks/nix/test_flake_e2e.py evaluates it): one `name = app "name" "name ..."`
    per top-level command of the click group, and none for a command that does not exist."""
    import click

    from sparkstack.cli import main

    commands = set(main.list_commands(click.Context(main)))
    rows = re.findall(r'^\s*(\w+) = app "(\w+)" "(\w+)\b', APPS_NIX.read_text(), re.M)
    assert rows and all(a == b == c for a, b, c in rows), rows
    apps = [a for a, _, _ in rows]
    assert len(apps) == len(set(apps)) and set(apps) == commands - NO_APP, sorted(set(apps) ^ (commands - NO_APP))
