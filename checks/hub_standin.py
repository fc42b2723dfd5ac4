"""A hub stand-in on 127.0.0.1: the few endpoints huggingface_hub uses to resolve a revision and download
a snapshot, over plain HTTP, with no xet. What huggingface_hub 2.x asks (read from its source):

- `GET /api/models/{repo}` and `GET /api/models/{repo}/revision/{rev}` (HfApi.model_info; with `?blobs=true`
  each sibling carries `size`, `blobId` and, for LFS files, `lfs: {sha256, size, pointerSize}`);
- `HEAD /{repo}/resolve/{rev}/{path}` (hf_hub_download's metadata): `X-Repo-Commit`, `ETag` (the git blob sha1),
  and for LFS files `X-Linked-Etag` (the sha256) and `X-Linked-Size`;
- `GET` of the same URL, honouring `Range: bytes=N-` (huggingface_hub resumes a dropped body with it).

Errors carry the hub's `X-Error-Code` (RepoNotFound, RevisionNotFound, EntryNotFound), which huggingface_hub
turns into its own exception types. Every request is logged (method, path, headers, bytes of body sent).
Nothing here uses sparkstack's code: blob names are computed from the served bytes.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Self
from urllib.parse import parse_qs, unquote, urlsplit

from http_standin import Served, serve, shut, url_of
from huggingface_hub.utils.sha import git_hash

OVERSIZE = 16 << 20  # more than one of huggingface_hub's 10 MB download chunks
LFS_SUFFIXES = (".safetensors",)  # stored with LFS on the hub, so named by their sha256 in a cache


def is_lfs(path: str) -> bool:
    return path.endswith(LFS_SUFFIXES)


def blob_name(path: str, data: bytes) -> str:
    """The name a hub cache gives this file's blob: sha256 for LFS files, git blob sha1 for the others."""
    return _sha256(data) if is_lfs(path) else git_hash(data)


_DIGESTS: dict[int, tuple[bytes, str]] = {}


def _sha256(data: bytes) -> str:
    """sha256 of a served body, computed once per body (large bodies are hashed on every HEAD and listing)."""
    held = _DIGESTS.get(id(data))
    if held is None or held[0] is not data:
        held = _DIGESTS[id(data)] = (data, hashlib.sha256(data).hexdigest())
    return held[1]


def commit_hash(files: dict[str, bytes], parent: str = "") -> str:
    h = hashlib.sha1(parent.encode())
    for path in sorted(files):
        h.update(path.encode() + b"\0" + hashlib.sha256(files[path]).digest())
    return h.hexdigest()


@dataclass
class HubRepo:
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)  # commit -> {path: bytes}
    refs: dict[str, str] = field(default_factory=dict)  # branch -> commit

    def commit(self, files: dict[str, bytes], branch: str = "main") -> str:
        """A new commit holding exactly `files`, and the branch moved to it."""
        sha = commit_hash(files, self.refs.get(branch, ""))
        self.commits[sha] = dict(files)
        self.refs[branch] = sha
        return sha

    def resolve(self, rev: str) -> str | None:
        return rev if rev in self.commits else self.refs.get(rev)


def files_of(flat: Path) -> dict[str, bytes]:
    return {p.relative_to(flat).as_posix(): p.read_bytes() for p in sorted(flat.rglob("*")) if p.is_file()}


class HubStandin(Served):
    """`faults`: {"corrupt": path} serves that file with its first byte flipped (same size, same names);
    {"drop_once": path} ends the first GET of that file's body half way, by closing the connection;
    {"missing": path} answers 404 EntryNotFound for that file, though the listing names it;
    {"info_sha": value} puts that value as the commit in every model_info answer;
    {"stall": path} sends the first GET of that file half its body, then nothing until `released` is set;
    {"oversize": path} answers a GET of that file with its body and OVERSIZE bytes more, promising twice that
    many more in Content-Length, then sends nothing until `released` is set;
    {"redirect": url} answers every resolve request for an LFS file with a 302 to `url`/cdn/<sha256>, as the real
    hub sends LFS files to its CDN (the names and size ride on the 302);
    {"status": code} answers every request with that HTTP code (a CDN that fails);
    {"etag": value} names every file's blob `value` in the HEAD answer (X-Linked-Etag for LFS files, else ETag).
    `token`: when set, every request must carry `Authorization: Bearer <token>` (else 401)."""

    def __init__(self, repos: dict[str, HubRepo], token: str | None = None) -> None:
        self.repos = repos
        self.token = token
        self.faults: dict[str, str] = {}
        self.log: list[dict] = []
        self._dropped: set[str] = set()
        self.released = threading.Event()
        self._lock = threading.Lock()

    def start(self) -> Self:
        self.server = serve(self._handler())
        return self

    def stop(self) -> None:
        shut(self.server)

    @property
    def url(self) -> str:
        return url_of(self.server)

    def requests(self, kind: str | None = None) -> list[dict]:
        """Logged requests; kind "api" (model_info), "head" or "get" (file metadata / file bodies)."""
        with self._lock:
            log = list(self.log)
        return [r for r in log if kind is None or r["kind"] == kind]

    def downloads(self) -> list[dict]:
        return [r for r in self.requests("get") if r["status"] in (200, 206)]

    def _record(self, entry: dict) -> None:
        with self._lock:
            self.log.append(entry)

    def _handler(self):
        standin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                self._handle(head=False)

            def do_HEAD(self) -> None:
                self._handle(head=True)

            def _send(self, code: int, body: bytes, headers: dict, head: bool, entry: dict,
                      cut_at: int | None = None) -> None:
                entry["status"] = code
                self.send_response(code)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                sent = body if cut_at is None else body[:cut_at]
                if not head:
                    try:
                        self.wfile.write(sent)
                        self.wfile.flush()
                    except (BrokenPipeError, ConnectionResetError):
                        pass
                entry["body_bytes"] = 0 if head else len(sent)
                if cut_at is not None:
                    self.close_connection = True  # the rest of the promised body never comes
                standin._record(entry)

            def _error(self, code: int, error_code: str, head: bool, entry: dict, commit: str | None = None) -> None:
                headers = {"Content-Type": "application/json", "X-Error-Code": error_code}
                if commit:
                    headers["X-Repo-Commit"] = commit
                body = json.dumps({"error": error_code}).encode()
                self._send(code, body, headers, head, entry)

            def _handle(self, head: bool) -> None:
                url = urlsplit(self.path)
                path = unquote(url.path)
                entry = {"method": self.command, "path": path, "query": url.query,
                         "headers": {k.lower(): v for k, v in self.headers.items()}, "kind": "other"}
                if "status" in standin.faults:
                    return self._error(int(standin.faults["status"]), "Failing", head, entry)
                if standin.token is not None and self.headers.get("Authorization") != f"Bearer {standin.token}":
                    return self._error(401, "RepoNotFound", head, entry)
                api = re.match(r"^/api/models/(?P<repo>[^/]+/[^/]+)(/revision/(?P<rev>[^/]+))?$", path)
                resolve = re.match(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$", path)
                if api or resolve:
                    entry["kind"] = "api" if api else "head" if head else "get"
                    m = api or resolve
                    repo = standin.repos.get(m["repo"])
                    if repo is None:
                        return self._error(404, "RepoNotFound", head, entry)
                    sha = repo.resolve(m["rev"] or "main")
                    if sha is None:
                        return self._error(404, "RevisionNotFound", head, entry)
                    if api:
                        return self._info(m["repo"], repo.commits[sha], sha, "blobs" in parse_qs(url.query), head, entry)
                    entry["file"] = m["file"]
                    return self._file(repo.commits[sha], sha, m["file"], head, entry)
                if path == "/api/agent-harnesses":  # the telemetry registry the real hub serves (fetch must not ask)
                    entry["kind"] = "telemetry"
                    body = json.dumps({"standardEnvVars": [], "harnesses": {}}).encode()
                    return self._send(200, body, {"Content-Type": "application/json"}, head, entry)
                return self._error(404, "NotFound", head, entry)

            def _info(self, name: str, files: dict[str, bytes], sha: str, blobs: bool, head: bool, entry: dict) -> None:
                siblings = []
                for path, data in sorted(files.items()):
                    s = {"rfilename": path}
                    if blobs:
                        pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{_sha256(data)}" \
                                  f"\nsize {len(data)}\n".encode()
                        s.update(size=len(data), blobId=git_hash(pointer if is_lfs(path) else data))
                        if is_lfs(path):
                            s["lfs"] = {"sha256": _sha256(data), "size": len(data),
                                        "pointerSize": len(pointer)}
                    siblings.append(s)
                sha = standin.faults.get("info_sha", sha)  # a hub answering for another commit, or with no hash
                body = json.dumps({"id": name, "modelId": name, "sha": sha, "private": False, "siblings": siblings}).encode()
                self._send(200, body, {"Content-Type": "application/json"}, head, entry)

            def _file(self, files: dict[str, bytes], sha: str, file: str, head: bool, entry: dict) -> None:
                data = files.get(file)
                if data is None or standin.faults.get("missing") == file:
                    return self._error(404, "EntryNotFound", head, entry, commit=sha)
                names = {"X-Repo-Commit": sha, "ETag": f'"{blob_name(file, data)}"',
                         "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
                if is_lfs(file):
                    names.update({"X-Linked-Etag": f'"{blob_name(file, data)}"', "X-Linked-Size": str(len(data))})
                if "etag" in standin.faults:  # a hostile hub: a blob name that is a path
                    names["X-Linked-Etag" if is_lfs(file) else "ETag"] = f'"{standin.faults["etag"]}"'
                if "redirect" in standin.faults and is_lfs(file):
                    names["Location"] = f"{standin.faults['redirect']}/cdn/{blob_name(file, data)}"
                    return self._send(302, b"", names, head, entry)
                if standin.faults.get("corrupt") == file:
                    data = bytes([data[0] ^ 0xFF]) + data[1:]
                start = 0
                m = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", ""))
                if m and not head:
                    start = int(m[1])
                    entry["range_start"] = start
                    names["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
                body = data[start:]
                cut = None
                if not head and standin.faults.get("oversize") == file:
                    cut = len(body) + OVERSIZE
                    body += bytes(2 * OVERSIZE)
                if not head and file in (standin.faults.get("drop_once"), standin.faults.get("stall")) \
                        and file not in standin._dropped:
                    standin._dropped.add(file)
                    cut = len(body) // 2
                self._send(206 if m and not head else 200, body, names, head, entry, cut_at=cut)
                if cut is not None and file in (standin.faults.get("stall"), standin.faults.get("oversize")):
                    standin.released.wait(60)  # the client hangs on the rest of the body until it is killed

        return Handler


# ---------------------------------------------------------------- the shipped recipe's two repos, synthetic

RECIPE = Path(__file__).parents[1] / "recipes/glm53-flash-dflash2-nvfp4/recipe.toml"
MODEL, DRAFTER = "LibertAIDAI/GLM-5.3-Flash-NVFP4", "incoai/GLM-5.3-Flash-DFlash2"


def synthetic_repos(tmp: Path) -> dict[str, HubRepo]:
    """The recipe's model (three shards and an index) and drafter (one shard), one commit each on main;
    real safetensors files written by the safetensors library (checks/synth.py)."""
    import synth

    synth.write_model_dir(tmp / "model")
    synth.write_model_dir(tmp / "drafter", index=False,
                          shards={"model.safetensors": synth.DEFAULT_SHARDS["model-00001-of-00003.safetensors"]})
    repos = {MODEL: HubRepo(), DRAFTER: HubRepo()}
    repos[MODEL].commit(files_of(tmp / "model"))
    repos[DRAFTER].commit(files_of(tmp / "drafter"))
    return repos


def recipe_copy(dest: Path, model_revision: str = "unpinned", drafter_revision: str = "unpinned") -> Path:
    """The shipped recipe, written to `dest` with these revisions (its comments as they are)."""
    text = RECIPE.read_text()
    assert text.count('model_revision = "unpinned"') == 1 and text.count('revision = "unpinned"  #') == 1
    text = text.replace('model_revision = "unpinned"', f'model_revision = "{model_revision}"')
    text = text.replace('\nrevision = "unpinned"  #', f'\nrevision = "{drafter_revision}"  #')
    dest.write_text(text)
    return dest
