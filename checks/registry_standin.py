"""A registry stand-in on 127.0.0.1: the distribution protocol's pull side, and its faults on demand.

- `/v2/` and every repository path answer 401 with a `WWW-Authenticate: Bearer realm=...,service=...,scope=...`
  challenge until a token from `/token` is presented.
- Manifests are content-negotiated: an answer only in a media type the client's Accept names, else 404.
  Each carries `Docker-Content-Digest`.
- Blobs answer 307 to a second server (another port: the "CDN"), which refuses with 400 any request
  carrying `Authorization`, as a signed CDN URL does.
- `faults` switches on hostile answers (see FAULTS); `move_tag` re-points a tag.

Every request is logged (which server, method, path, headers), so tests can see who sent what where.
Nothing here uses sparkstack's code: digests are computed from the bytes served.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from http_standin import Served, StandinServer, serve, shut, url_of

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"

FAULTS = {
    "corrupt-blob",        # the CDN serves every blob with one byte flipped
    "non-json",            # manifests are served as a non-JSON body (with a digest header that matches it)
    "wrong-digest-header",  # Docker-Content-Digest names other bytes
    "wrong-body",          # a manifest fetched by digest comes back as other (valid) bytes
    "huge-manifest",       # a manifest body far over any sane cap, without Content-Length
    "redirect-loop",       # blob redirects go round in a circle
    "token-error",         # the token endpoint answers 500
    "token-garbage",       # the token endpoint answers 200 with something that is not a token
    "access-token-only",   # the token endpoint names it access_token (as OAuth2 does), not token
    "basic-auth",          # 401 asks for Basic credentials instead of a bearer token
    "deny",                # tokens are handed out but never accepted
    "hang",                # manifests answer only after `hang_s` seconds
    "blob-sends-auth-ok",  # (control) the CDN stops refusing Authorization
}


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass
class Repo:
    manifests: dict[str, tuple[bytes, str]] = field(default_factory=dict)  # digest -> (body, media type)
    tags: dict[str, str] = field(default_factory=dict)  # tag -> digest
    blobs: dict[str, Path | bytes] = field(default_factory=dict)  # digest -> file or bytes

    def add_manifest(self, body: bytes, media: str, tag: str | None = None) -> str:
        d = sha(body)
        self.manifests[d] = (body, media)
        if tag:
            self.tags[tag] = d
        return d

    def add_layout(self, layout: Path) -> None:
        """Every blob of an OCI layout dir; its manifests (by their mediaType) as manifests too."""
        for p in sorted((layout / "blobs" / "sha256").iterdir()):
            d = "sha256:" + p.name
            self.blobs[d] = p
            try:
                doc = json.loads(p.read_bytes())
            except (ValueError, UnicodeDecodeError):
                continue
            if isinstance(doc, dict) and doc.get("mediaType") in (OCI_MANIFEST, OCI_INDEX, DOCKER_MANIFEST, DOCKER_LIST):
                self.manifests[d] = (p.read_bytes(), doc["mediaType"])

    def blob_bytes(self, digest: str) -> bytes | None:
        b = self.blobs.get(digest)
        return b.read_bytes() if isinstance(b, Path) else b


class Standin(Served):
    def __init__(self, repos: dict[str, Repo], service: str = "standin") -> None:
        self.repos = repos
        self.service = service
        self.faults: set[str] = set()
        self.hang_s = 5.0
        self.log: list[dict] = []
        self.tokens: set[str] = set()
        self._lock = threading.Lock()
        self._servers: list[StandinServer] = []

    # ---- life

    def start(self) -> Standin:
        self.registry = self._serve(self._registry_handler())
        self.cdn = self._serve(self._cdn_handler())
        return self

    def _serve(self, handler) -> StandinServer:
        server = serve(handler)
        self._servers.append(server)
        return server

    def stop(self) -> None:
        for s in self._servers:
            shut(s)

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.registry.server_address[1]}"

    @property
    def url(self) -> str:
        return f"http://{self.host}"

    @property
    def cdn_url(self) -> str:
        return url_of(self.cdn)

    def move_tag(self, repo: str, tag: str, digest: str) -> None:
        self.repos[repo].tags[tag] = digest

    def requests(self, server: str) -> list[dict]:
        with self._lock:
            return [r for r in self.log if r["server"] == server]

    def _record(self, server: str, handler: BaseHTTPRequestHandler) -> None:
        with self._lock:
            self.log.append({"server": server, "method": handler.command, "path": handler.path,
                             "headers": {k.lower(): v for k, v in handler.headers.items()}})

    # ---- the registry

    def _registry_handler(self):
        standin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_HEAD(self) -> None:
                self._handle(head=True)

            def do_GET(self) -> None:
                self._handle(head=False)

            def _send(self, code: int, body: bytes = b"", headers: dict | None = None, head: bool = False,
                      length: bool = True) -> None:
                self.send_response(code)
                self.send_header("Docker-Distribution-API-Version", "registry/2.0")
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                if length:
                    self.send_header("Content-Length", str(len(body)))
                else:
                    self.send_header("Connection", "close")
                    self.close_connection = True
                self.end_headers()
                if not head and body:
                    try:
                        self.wfile.write(body)
                    except (BrokenPipeError, ConnectionResetError):
                        pass

            def _error(self, code: int, name: str, head: bool = False, headers: dict | None = None) -> None:
                body = json.dumps({"errors": [{"code": name, "message": name.lower()}]}).encode()
                self._send(code, body, {"Content-Type": "application/json", **(headers or {})}, head)

            def _handle(self, head: bool) -> None:
                standin._record("registry", self)
                url = urlsplit(self.path)
                if url.path == "/token":
                    return self._token(url)
                if not url.path.startswith("/v2/"):
                    return self._error(404, "NOT_FOUND", head)
                m = re.match(r"^/v2/(?P<repo>.+)/(?P<kind>manifests|blobs)/(?P<ref>[^/]+)$", url.path)
                scope = f"repository:{m['repo']}:pull" if m else ""
                if not self._authorized():
                    if "basic-auth" in standin.faults:
                        challenge = f'Basic realm="{standin.service}"'
                    else:
                        challenge = f'Bearer realm="{standin.url}/token",service="{standin.service}"' + \
                            (f',scope="{scope}"' if scope else "")
                    return self._error(401, "UNAUTHORIZED", head, {"WWW-Authenticate": challenge})
                if url.path == "/v2/":
                    return self._send(200, b"{}", {"Content-Type": "application/json"}, head)
                if m is None or m["repo"] not in standin.repos:
                    return self._error(404, "NAME_UNKNOWN", head)
                repo = standin.repos[m["repo"]]
                if m["kind"] == "manifests":
                    return self._manifest(repo, m["ref"], head)
                return self._blob(repo, m["repo"], m["ref"], head)

            def _authorized(self) -> bool:
                auth = self.headers.get("Authorization", "")
                if "deny" in standin.faults:
                    return False
                return auth.startswith("Bearer ") and auth[7:] in standin.tokens

            def _token(self, url) -> None:
                q = parse_qs(url.query)
                if "token-error" in standin.faults:
                    return self._send(500, b"internal error", {"Content-Type": "text/plain"})
                if "token-garbage" in standin.faults:
                    return self._send(200, b'{"detail": "no token for you"}', {"Content-Type": "application/json"})
                if q.get("service") != [standin.service] or not q.get("scope", [""])[0].startswith("repository:"):
                    return self._error(400, "BAD_TOKEN_REQUEST")
                token = secrets.token_hex(16)
                standin.tokens.add(token)
                doc = {"access_token": token} if "access-token-only" in standin.faults else {"token": token}
                self._send(200, json.dumps(doc).encode(), {"Content-Type": "application/json"})

            def _manifest(self, repo: Repo, ref: str, head: bool) -> None:
                if "hang" in standin.faults:
                    time.sleep(standin.hang_s)
                digest = ref if ref.startswith("sha256:") else repo.tags.get(ref)
                if digest is None or digest not in repo.manifests:
                    return self._error(404, "MANIFEST_UNKNOWN", head)
                body, media = repo.manifests[digest]
                accepted = {a.split(";")[0].strip() for h in self.headers.get_all("Accept") or [] for a in h.split(",")}
                if media not in accepted:
                    return self._error(404, "MANIFEST_UNKNOWN", head)  # no acceptable representation
                header_digest = digest
                if "non-json" in standin.faults:
                    body = b"<html>this is not a manifest</html>"
                    header_digest = sha(body)
                if "wrong-body" in standin.faults and ref.startswith("sha256:"):
                    other = [b for d, (b, m) in repo.manifests.items() if d != digest]
                    body = other[0] if other else body + b" "
                    header_digest = sha(body)
                if "wrong-digest-header" in standin.faults:
                    header_digest = sha(b"some other bytes")
                if "huge-manifest" in standin.faults:
                    return self._huge(media, head)
                self._send(200, body, {"Content-Type": media, "Docker-Content-Digest": header_digest}, head)

            def _huge(self, media: str, head: bool) -> None:
                self.send_response(200)
                self.send_header("Content-Type", media)
                self.send_header("Connection", "close")
                self.close_connection = True
                self.end_headers()
                if head:
                    return
                chunk = b" " * (1 << 20)
                try:
                    for _ in range(64):  # 64 MiB of whitespace, no Content-Length
                        self.wfile.write(chunk)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def _blob(self, repo: Repo, name: str, digest: str, head: bool) -> None:
                if digest not in repo.blobs:
                    return self._error(404, "BLOB_UNKNOWN", head)
                if "redirect-loop" in standin.faults:
                    target = f"{standin.cdn_url}/loop/a?d={digest}"
                else:
                    target = f"{standin.cdn_url}/blob/{name}/{digest}?sig={secrets.token_hex(8)}"
                self._send(307, b"", {"Location": target}, head)

        return Handler

    # ---- the CDN

    def _cdn_handler(self):
        standin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_HEAD(self) -> None:
                self._handle(head=True)

            def do_GET(self) -> None:
                self._handle(head=False)

            def _plain(self, code: int, text: str, headers: dict | None = None) -> None:
                body = text.encode()
                self.send_response(code)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _handle(self, head: bool) -> None:
                standin._record("cdn", self)
                if "authorization" in {k.lower() for k in self.headers.keys()} and \
                        "blob-sends-auth-ok" not in standin.faults:
                    # A signed URL already carries its credentials; a second one is a bad request.
                    return self._plain(400, "Only one auth mechanism allowed; Authorization header refused")
                url = urlsplit(self.path)
                if url.path.startswith("/loop/"):
                    nxt = "/loop/b" if url.path == "/loop/a" else "/loop/a"
                    return self._plain(307, "", {"Location": f"{standin.cdn_url}{nxt}?{url.query}"})
                m = re.match(r"^/blob/(?P<repo>.+)/(?P<digest>sha256:[0-9a-f]{64})$", url.path)
                if m is None or m["repo"] not in standin.repos:
                    return self._plain(404, "no such object")
                data = standin.repos[m["repo"]].blob_bytes(m["digest"])
                if data is None:
                    return self._plain(404, "no such object")
                if "corrupt-blob" in standin.faults and data:
                    data = bytes([data[0] ^ 0xFF]) + data[1:]
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if not head:
                    try:
                        self.wfile.write(data)
                    except (BrokenPipeError, ConnectionResetError):
                        pass

        return Handler


# ---------------------------------------------------------------- the fixture base, served


@dataclass(frozen=True)
class Served:
    """What the stand-in serves for the fixture, with digests computed here from the served bytes."""

    repo: str
    tag: str
    index: str  # digest of the multi-arch index the tag names
    index_size: int
    platforms: dict  # "linux/arm64" -> {"manifest", "config", "layers": [...]} (digests), "manifest_size"
    layouts: dict  # "linux/arm64" -> layout dir


def fixture_repo(tmp: Path, repo: str = "tonyd2wild/vllm-glm53-flash", tag: str = "sm121-v8",
                 filler_bytes: int = 64 << 10) -> tuple[dict[str, Repo], Served]:
    """The fixture base (checks/imagefix.py) for arm64 and amd64, behind one OCI index under `tag`."""
    import imagefix as fx

    r = Repo()
    platforms, layouts, entries = {}, {}, []
    for arch in ("arm64", "amd64"):
        layout = tmp / f"layout-{arch}"
        facts = fx.write_base(layout, layers=fx.default_layers(filler_bytes=filler_bytes), arch=arch)
        r.add_layout(layout)
        man_bytes = (layout / "blobs/sha256" / facts["manifest"].split(":")[1]).read_bytes()
        platforms[f"linux/{arch}"] = {**facts, "manifest_size": len(man_bytes)}
        layouts[f"linux/{arch}"] = layout
        entries.append({"mediaType": OCI_MANIFEST, "digest": facts["manifest"], "size": len(man_bytes),
                        "platform": {"os": "linux", "architecture": arch, **({"variant": "v8"} if arch == "arm64" else {})}})
    index = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries}, indent=2).encode()
    d = r.add_manifest(index, OCI_INDEX, tag)
    return {repo: r}, Served(repo, tag, d, len(index), platforms, layouts)
