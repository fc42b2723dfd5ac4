"""A registry v2 client for pinning and fetching: anonymous bearer tokens, content negotiation, blob redirects.

Every answer is distrusted: bodies are capped and hashed, `Docker-Content-Digest` must
name the bytes that came, redirects are bounded, and the bearer token is sent only to
the registry's own origin (a signed CDN URL refuses a request that carries one).
Every failure is one `SparkstackError` line.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit, urlunsplit

import requests
import urllib3

from sparkstack import __version__
from sparkstack.errors import SparkstackError, UsageError
from sparkstack.oci.model import DOCKER_MANIFEST_LIST, DOCKER_MANIFEST_V2, INDEX_V1, MANIFEST_V1, digest_hex

MIRROR_ENV = "SPARKSTACK_REGISTRY_MIRROR"
TIMEOUT_ENV = "SPARKSTACK_REGISTRY_TIMEOUT"
MANIFEST_TYPES = (INDEX_V1, MANIFEST_V1, DOCKER_MANIFEST_LIST, DOCKER_MANIFEST_V2)
INDEX_TYPES = (INDEX_V1, DOCKER_MANIFEST_LIST)
MANIFEST_CAP = 4 << 20  # what the reference registry accepts for a manifest
CONFIG_CAP = 8 << 20
MAX_HOPS = 5
CHUNK = 1 << 20
_REDIRECTS = (301, 302, 303, 307, 308)
_NAME = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


# ---------------------------------------------------------------- references


@dataclass(frozen=True)
class Reference:
    registry: str  # as written: ghcr.io, localhost:5000, docker.io
    repository: str
    tag: str | None
    digest: str | None

    @property
    def ref(self) -> str:
        """What the manifests endpoint is asked for: the digest when there is one, else the tag."""
        return self.digest or self.tag or "latest"

    def __str__(self) -> str:
        return f"{self.registry}/{self.repository}" + (f":{self.tag}" if self.tag else "") + \
            (f"@{self.digest}" if self.digest else "")


def parse_reference(text: str) -> Reference:
    """`[registry/]repo[:tag][@sha256:...]`, with docker's defaults (docker.io, library/, latest)."""
    rest, _, digest = text.partition("@")
    if digest:
        try:
            digest_hex(digest)
        except ValueError:
            raise UsageError(f"{text!r}: {digest!r} is not a sha256 digest") from None
    first, slash, remainder = rest.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        registry, path = first, remainder
    else:
        registry, path = "docker.io", rest
    tag = None
    head, colon, maybe_tag = path.rpartition(":")
    if colon and "/" not in maybe_tag:
        path, tag = head, maybe_tag
        if not _TAG.fullmatch(tag):
            raise UsageError(f"{text!r}: {tag!r} is not a valid tag")
    if registry == "docker.io" and "/" not in path:
        path = f"library/{path}"
    if not path or not _NAME.fullmatch(path):
        raise UsageError(f"{text!r}: {path!r} is not a valid repository name")
    if tag is None and not digest:
        tag = "latest"
    return Reference(registry, path, tag, digest or None)


def registry_url(registry: str) -> str:
    """Where requests for `registry` go: SPARKSTACK_REGISTRY_MIRROR when set, else https://<registry>; plain
    http for a loopback registry (localhost, 127.0.0.0/8, [::1]), as docker's own default insecure range."""
    mirror = os.environ.get(MIRROR_ENV, "").strip()
    if mirror:
        parts = urlsplit(mirror)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise SparkstackError(f"{MIRROR_ENV}={mirror!r}: expected an http(s) URL such as http://127.0.0.1:5000")
        return mirror.rstrip("/")
    host = "registry-1.docker.io" if registry == "docker.io" else registry
    return f"{'http' if is_loopback(host) else 'https'}://{host}"


def is_loopback(host: str) -> bool:
    """host[:port], the port and IPv6 brackets aside, names this machine."""
    name = host[1:].partition("]")[0] if host.startswith("[") else host.rpartition(":")[0] or host
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _timeout() -> float:
    value = os.environ.get(TIMEOUT_ENV, "").strip()
    if not value:
        return 30.0
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1
    if not 0 < seconds <= 3600:
        raise SparkstackError(f"{TIMEOUT_ENV}={value!r}: expected seconds between 0 and 3600")
    return seconds


def _origin(url: str) -> tuple[str, str, int | None]:
    """Scheme, host and port (defaults filled in): the unit a bearer token is bound to."""
    p = urlsplit(url)
    return p.scheme, (p.hostname or "").lower(), p.port or {"http": 80, "https": 443}.get(p.scheme)


def _why(exc: BaseException) -> str:
    """The telling part of a transport error: 'Connection refused', 'timed out', ..."""
    text = str(exc)
    if "timed out" in text.lower() or isinstance(exc, (requests.Timeout, urllib3.exceptions.TimeoutError)):
        return "timed out"
    m = re.search(r"\[Errno -?\d+\] ([^'\")\]]+)", text)
    if m:
        return m.group(1).strip()
    if isinstance(exc, (requests.exceptions.ChunkedEncodingError, urllib3.exceptions.ProtocolError)):
        return "the connection broke off mid-answer"
    if isinstance(exc, requests.exceptions.SSLError):
        return "TLS handshake failed"
    return type(exc).__name__


def _parse_challenge(header: str) -> tuple[str, dict[str, str]] | None:
    """The first challenge of a WWW-Authenticate header: (scheme, params)."""
    m = re.match(r"\s*([A-Za-z][A-Za-z0-9-]*)\s*(.*)", header or "")
    if not m:
        return None
    params = {k.lower(): (v if v is not None else u)
              for k, v, u in re.findall(r'([A-Za-z_]+)\s*=\s*(?:"([^"]*)"|([^,\s]*))', m.group(2))}
    return m.group(1), params


# ---------------------------------------------------------------- answers


class WrongBytes(SparkstackError):
    """The answer's bytes are not the named ones (their hash, their count, past the pinned size): unlike a cut
    connection, nothing of them may be kept to build on."""


@dataclass(frozen=True)
class Resume:
    """Where an interrupted blob fetch goes on: the bytes held (`offset`), their running sha256 (`hasher`),
    and `restart(start)`, told where the answer's bytes begin (offset, or 0 when the whole blob comes again)."""

    offset: int
    hasher: object  # a hashlib sha256, fed with the first `offset` bytes
    restart: Callable[[int], None]


@dataclass(frozen=True)
class Manifest:
    """A manifest or index as served: its bytes, their digest, and its media type."""

    body: bytes
    digest: str
    media_type: str

    @property
    def size(self) -> int:
        return len(self.body)


def _without_userinfo(url: str) -> str:
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc="***@" + parts.netloc.rsplit("@", 1)[1]))


class Registry:
    """One repository on one registry, spoken to over HTTP(S)."""

    def __init__(self, registry: str, repository: str, base_url: str | None = None) -> None:
        self.registry, self.repository = registry, repository
        self.base = base_url or registry_url(registry)
        self.timeout = _timeout()
        via = f" (via {_without_userinfo(self.base)})" if base_url or os.environ.get(MIRROR_ENV) else ""
        self.label = f"registry {registry}{via}"  # a mirror URL's user:password never reaches an error line
        self._token: str | None = None
        self._session = requests.Session()
        # Never let requests add credentials of its own (a ~/.netrc entry) to any hop; proxies
        # and CA bundles from the environment still apply.
        self._session.auth = lambda r: r
        self._session.headers.update({"User-Agent": f"sparkstack/{__version__}", "Accept-Encoding": "identity"})

    def close(self) -> None:
        self._session.close()

    # ---- transport

    def _get(self, url: str, headers: dict[str, str], what: str, auth: bool = True) -> requests.Response:
        """GET `url`, following at most MAX_HOPS redirects by hand. The token goes only to the registry's origin."""
        seen = []
        for _ in range(MAX_HOPS + 1):
            send = dict(headers)
            if auth and self._token and _origin(url) == _origin(self.base):
                send["Authorization"] = f"Bearer {self._token}"
            try:
                resp = self._session.get(url, headers=send, stream=True, allow_redirects=False, timeout=self.timeout)
            except requests.exceptions.InvalidURL:
                raise SparkstackError(f"{self.label}: {what}: bad URL {_without_userinfo(url)!r}") from None
            except (requests.RequestException, urllib3.exceptions.HTTPError) as exc:
                where, why = _without_userinfo("{}://{}".format(*urlsplit(url)[:2])), _why(exc)
                if why == "timed out":
                    raise SparkstackError(f"{self.label}: {what}: {where} did not answer within {self.timeout:g} s "
                                          "(timed out)") from None
                raise SparkstackError(f"{self.label}: {what}: cannot reach {where}: {why}") from None
            if resp.status_code not in _REDIRECTS:
                return resp
            location = resp.headers.get("Location")
            resp.close()
            if not location:
                raise SparkstackError(f"{self.label}: {what}: redirect {resp.status_code} without a Location")
            seen.append(url)
            url = urljoin(url, location)
            if urlsplit(url).scheme not in ("http", "https"):
                raise SparkstackError(f"{self.label}: {what}: redirect to a non-HTTP URL {url!r}")
            if url in seen:
                raise SparkstackError(f"{self.label}: {what}: redirect loop ({len(seen)} hops back to {_without_userinfo(url)})")
        raise SparkstackError(f"{self.label}: {what}: more than {MAX_HOPS} redirects")

    def _request(self, path: str, headers: dict[str, str], what: str) -> requests.Response:
        """GET a registry path, doing the anonymous bearer-token dance once on a 401."""
        url = self.base + path
        resp = self._get(url, headers, what)
        if resp.status_code == 401:
            challenge = resp.headers.get("WWW-Authenticate", "")
            resp.close()
            if self._token is not None:
                raise SparkstackError(f"{self.label}: {what}: access denied (401) even with a token")
            self._fetch_token(challenge, what)
            resp = self._get(url, headers, what)
            if resp.status_code == 401:
                resp.close()
                raise SparkstackError(f"{self.label}: {what}: access denied (401) even with a token")
        return resp

    def _fetch_token(self, challenge: str, what: str) -> None:
        parsed = _parse_challenge(challenge)
        if parsed is None or parsed[0].lower() != "bearer":
            scheme = parsed[0] if parsed else "no"
            raise SparkstackError(f"{self.label}: {what}: 401 with {scheme} challenge; only anonymous bearer "
                                  "tokens are supported (no credentials are used)")
        params = parsed[1]
        realm = params.get("realm", "")
        if urlsplit(realm).scheme not in ("http", "https"):
            raise SparkstackError(f"{self.label}: bearer challenge has no usable realm ({realm!r})")
        query = {"scope": params.get("scope") or f"repository:{self.repository}:pull"}
        if params.get("service"):
            query["service"] = params["service"]
        url = requests.Request("GET", realm, params=query).prepare().url
        resp = self._get(url, {"Accept": "application/json"}, "token", auth=False)
        try:
            if resp.status_code != 200:
                raise SparkstackError(f"{self.label}: token endpoint {realm} answered {resp.status_code}")
            body = _read_capped(resp, 1 << 20, self.label, "token", self.timeout)
        finally:
            resp.close()
        try:
            doc = json.loads(body)
        except (ValueError, RecursionError):
            raise SparkstackError(f"{self.label}: token endpoint {realm} did not answer JSON") from None
        token = (doc.get("token") or doc.get("access_token")) if isinstance(doc, dict) else None
        if not isinstance(token, str) or not token:
            raise SparkstackError(f"{self.label}: token endpoint {realm} gave no token")
        self._token = token

    def _fail_status(self, resp: requests.Response, what: str) -> None:
        code = resp.status_code
        resp.close()
        hint = {404: "not found", 403: "forbidden", 429: "rate limited"}.get(code, "")
        raise SparkstackError(f"{self.label}: {what}: answered {code}" + (f" ({hint})" if hint else ""))

    # ---- manifests

    def manifest(self, ref: str, accept: tuple[str, ...] = MANIFEST_TYPES, expect: str | None = None,
                 size: int | None = None) -> Manifest:
        """GET a manifest or index by tag or digest, checked: capped, hashed, media type known.

        `expect` (and a digest `ref`) must be the sha256 of the bytes; `Docker-Content-Digest`, when
        the registry sends it, must be too."""
        expect = expect or (ref if ref.startswith("sha256:") else None)
        what = f"manifest {self.repository}:{ref}" if not ref.startswith("sha256:") else f"manifest {ref}"
        resp = self._request(f"/v2/{self.repository}/manifests/{ref}", {"Accept": ", ".join(accept)}, what)
        try:
            if resp.status_code != 200:
                self._fail_status(resp, what)
            body = _read_capped(resp, MANIFEST_CAP, self.label, what, self.timeout)
            header_digest = resp.headers.get("Docker-Content-Digest")
            content_type = resp.headers.get("Content-Type", "").split(";")[0].strip()
        finally:
            resp.close()
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        if header_digest is not None and header_digest.strip() != digest:
            raise WrongBytes(f"{self.label}: {what}: Docker-Content-Digest {header_digest.strip()} "
                                  f"does not match the body ({digest})")
        if expect is not None and digest != expect:
            raise SparkstackError(f"{self.label}: {what}: body is {digest}, not the digest asked for")
        if size is not None and len(body) != size:
            raise SparkstackError(f"{self.label}: {what}: {len(body)} bytes, not the {size} its descriptor says")
        media_type = _manifest_media_type(body, content_type, self.label, what)
        if media_type not in accept:
            raise SparkstackError(f"{self.label}: {what}: served {media_type}, which was not asked for")
        return Manifest(body, digest, media_type)

    # ---- blobs

    def small_blob(self, digest: str, size: int | None = None, cap: int = CONFIG_CAP) -> bytes:
        """A config-sized blob, read whole and checked against its digest."""
        chunks = []
        for chunk in self.stream(("blobs", digest), size, cap=cap):
            chunks.append(chunk)
        return b"".join(chunks)

    def stream(self, target: tuple[str, str], size: int | None, accept: tuple[str, ...] = MANIFEST_TYPES,
               cap: int | None = None, on_progress: Callable[[int], None] | None = None,
               check_digest: bool = True, resume: Resume | None = None) -> Iterator[bytes]:
        """Yield the bytes of a blob (`("blobs", digest)`) or manifest (`("manifests", digest)`).

        The stream stops with an error on more bytes than `size` (or `cap`); after the last chunk
        it checks the count and the sha256 against the digest, so a caller that consumed every chunk
        without an error holds exactly the named bytes. `check_digest=False` leaves out the sha256
        comparisons (body and Docker-Content-Digest), never the size checks: only for a caller that
        checks the digest itself (a Nix fixed-output derivation).

        `resume` (a blob of known size only) asks for the bytes from `resume.offset` on with a Range
        request. The registry's answer decides where the yielded bytes start, and `resume.restart(start)`
        is told before the first one: `offset` on a 206 whose Content-Range says exactly that range (the
        count and the hash then go on from `resume.hasher`, fed with the bytes the caller holds), 0 on a
        200 (a registry or CDN that ignores Range, or refuses it with 416, or answers a 206 for some other range:
        the whole blob comes again). Wrong bytes raise WrongBytes; a failed transfer, SparkstackError."""
        kind, digest = target
        what = f"{'blob' if kind == 'blobs' else 'manifest'} {digest}"
        headers = {"Accept": ", ".join(accept)} if kind == "manifests" else {}
        if resume is not None:
            if kind != "blobs" or size is None or not 0 < resume.offset < size:
                raise ValueError("resume needs a blob of known size and an offset inside it")
            headers["Range"] = f"bytes={resume.offset}-"
        limit = size if size is not None else (cap if cap is not None else MANIFEST_CAP if kind == "manifests" else None)
        resp = self._request(f"/v2/{self.repository}/{kind}/{digest}", headers, what)
        ranged = resume is not None and resp.status_code == 206 and \
            resp.headers.get("Content-Range", "").strip() == f"bytes {resume.offset}-{size - 1}/{size}"
        if resume is not None and resp.status_code in (206, 416) and not ranged:
            # the range refused, or answered with some other range than asked: ask for the whole blob
            resp.close()
            headers.pop("Range")
            resp = self._request(f"/v2/{self.repository}/{kind}/{digest}", headers, what)
        h = hashlib.sha256()
        count = 0
        try:
            if ranged:
                h, count = resume.hasher, resume.offset
                resume.restart(resume.offset)
            elif resp.status_code != 200:
                self._fail_status(resp, what)
            elif resume is not None:
                resume.restart(0)
            header_digest = resp.headers.get("Docker-Content-Digest") if kind == "manifests" else None
            length = resp.headers.get("Content-Length")
            if limit is not None and length and length.isdigit() and count + int(length) > limit:
                raise WrongBytes(f"{self.label}: {what}: {length} bytes announced, more than "
                                      f"{'its pinned size' if size is not None else 'the cap'} ({limit})")
            budget = max(self.timeout * 4, 10) if size is None or size <= CONFIG_CAP else None
            for chunk in _chunks(resp, self.label, what, budget):
                count += len(chunk)
                if limit is not None and count > limit:
                    raise WrongBytes(f"{self.label}: {what}: more than "
                                          f"{'its pinned size' if size is not None else 'the cap of'} {limit} bytes")
                h.update(chunk)
                if on_progress:
                    on_progress(len(chunk))
                yield chunk
        finally:
            resp.close()
        got = "sha256:" + h.hexdigest()
        if not check_digest:
            header_digest = None
        elif got != digest:
            raise WrongBytes(f"{self.label}: {what}: the bytes served hash to {got}; refusing them")
        if size is not None and count != size:
            raise WrongBytes(f"{self.label}: {what}: {count} bytes, not the pinned {size}")
        if header_digest is not None and header_digest.strip() != got:
            raise WrongBytes(f"{self.label}: {what}: Docker-Content-Digest {header_digest.strip()} "
                                  f"does not match the body")


def _chunks(resp: requests.Response, label: str, what: str, budget: float | None = None) -> Iterator[bytes]:
    """Raw body chunks (no content decoding: the digest names the bytes as stored). Each read waits at
    most the timeout; a small, capped answer also gets an overall `budget`, so a server that drips one
    byte at a time cannot hold a manifest forever. (A multi-GB layer gets none: on a slow link it may
    rightly take long, and its pinned size bounds it.)"""
    deadline = time.monotonic() + budget if budget is not None else None
    try:
        for chunk in resp.raw.stream(CHUNK, decode_content=False):
            if deadline is not None and time.monotonic() > deadline:
                raise SparkstackError(f"{label}: {what}: too slow: no end after {budget:.0f} s")
            yield chunk
    except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as exc:
        raise SparkstackError(f"{label}: {what}: reading the answer failed: {_why(exc)}") from None


def _read_capped(resp: requests.Response, cap: int, label: str, what: str, timeout: float) -> bytes:
    length = resp.headers.get("Content-Length")
    if length and length.isdigit() and int(length) > cap:
        raise SparkstackError(f"{label}: {what}: {int(length)} bytes announced, more than the cap of {cap}")
    parts, total = [], 0
    for chunk in _chunks(resp, label, what, budget=max(timeout * 4, 10)):
        total += len(chunk)
        if total > cap:
            raise SparkstackError(f"{label}: {what}: more than the cap of {cap} bytes")
        parts.append(chunk)
    return b"".join(parts)


def _manifest_media_type(body: bytes, content_type: str, label: str, what: str) -> str:
    """The body's own mediaType when it names one (it is what the digest covers), else Content-Type."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        raise SparkstackError(f"{label}: {what}: not JSON ({len(body)} bytes, Content-Type {content_type or 'none'})") from None
    if not isinstance(doc, dict):
        raise SparkstackError(f"{label}: {what}: not a JSON object")
    media = doc.get("mediaType") if isinstance(doc.get("mediaType"), str) else content_type
    if media not in MANIFEST_TYPES:
        raise SparkstackError(f"{label}: {what}: unsupported media type {media or '(none)'}")
    return media


@contextmanager
def open_registry(registry: str, repository: str) -> Iterator[Registry]:
    reg = Registry(registry, repository)
    try:
        yield reg
    finally:
        reg.close()
