"""The hub, through huggingface_hub: a repo's current commit, one commit's file list, one file into a cache dir.

huggingface_hub reads HF_ENDPOINT, HF_TOKEN and HF_HUB_OFFLINE itself (its settings are checked here first, so a
bad one is one line naming it). Whatever the hub answers is
checked before it is used (commits are 40 hex, paths stay inside the snapshot, blob names are hashes),
and every failure becomes one line naming the repo, the revision and what went wrong.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Self
from urllib.parse import urlsplit

from sparkstack.errors import SparkstackError
from sparkstack.hfcache import COMMIT, SHA256, ListedFile

# Settings huggingface_hub reads with int() when it is imported: a bad one would raise there, unexplained.
_WHOLE_SECONDS = ("HF_HUB_ETAG_TIMEOUT", "HF_HUB_DOWNLOAD_TIMEOUT")
_ready = False


def _library() -> None:
    """huggingface_hub, its settings checked, before its first use.

    No telemetry: with it, huggingface_hub fetches an agent registry for its user agent and caches it in
    $HF_HOME, a write that neither a fetch nor a dry run may make. Its logger is silenced: it warns of every
    retry ("Trying to resume download..."), and fetch's own lines say how each file ended."""
    global _ready
    if _ready:
        return
    for name in _WHOLE_SECONDS:
        value = os.environ.get(name)
        if value is not None and not value.strip().isdigit():
            raise SparkstackError(f"{name}={value!r}: not a whole number of seconds")
    url = os.environ.get("HF_ENDPOINT")
    if url is not None:
        try:
            parts = urlsplit(url)
            usable = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
        except ValueError:  # an unclosed [IPv6 bracket, a port that is not a number
            usable = False
        if not usable:
            raise SparkstackError(f"HF_ENDPOINT={url!r}: not an http:// or https:// URL of a hub")
    from huggingface_hub import constants
    from huggingface_hub.utils import logging as hub_logging

    constants.HF_HUB_DISABLE_TELEMETRY = True  # read at each request, not only at import
    hub_logging.get_logger().setLevel(logging.CRITICAL + 1)  # after its import, which sets the level
    _ready = True


def endpoint() -> str:
    _library()
    from huggingface_hub import constants

    return constants.ENDPOINT


def _origin(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    return parts.scheme, parts.netloc


def _answered(url: object) -> str:
    """Who answered a request for `url`: the hub, or the host the hub sent it to (the CDN of an LFS file)."""
    if url is None or _origin(str(url)) == _origin(endpoint()):
        return f"the hub at {endpoint()}"
    return f"{'://'.join(_origin(str(url)))} (where the hub at {endpoint()} sent it)"


def _request_url(exc: Exception) -> object:
    try:
        return exc.request.url
    except (AttributeError, RuntimeError):  # httpx raises RuntimeError when no request is attached
        return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__


def _transport_error() -> type[Exception]:
    """The transport error of the HTTP client the installed huggingface_hub speaks: httpx for 1.x (what
    nixpkgs carries), httpx2 for 2.x. Neither is sparkstack's own dependency: each comes with the major
    that needs it (checks/unit/test_declared_imports.py holds that to the installed huggingface_hub's
    requirements), and the fetch suites run under both (checks/nix/test_hub_majors.py)."""
    import huggingface_hub

    if int(huggingface_hub.__version__.split(".")[0]) >= 2:
        import httpx2

        return httpx2.TransportError
    import httpx

    return httpx.TransportError


@contextmanager
def hub_errors(what: str) -> Iterator[None]:
    """huggingface_hub's and its transport's exceptions, as one line about `what` (e.g. `org/name@rev`)."""
    _library()  # first: huggingface_hub 1.x reads its settings when its errors module is imported
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    transport_error = _transport_error()
    try:
        yield
    except OfflineModeIsEnabled:
        raise SparkstackError(f"{what}: HF_HUB_OFFLINE is set in this environment; unset it to fetch") from None
    except RevisionNotFoundError:
        raise SparkstackError(f"{what}: the hub at {endpoint()} has no such revision") from None
    except RemoteEntryNotFoundError:
        raise SparkstackError(f"{what}: the hub at {endpoint()} has no such file (404)") from None
    except GatedRepoError:
        raise SparkstackError(f"{what}: a gated repo: accept its terms on the hub and set HF_TOKEN") from None
    except RepositoryNotFoundError:
        raise SparkstackError(f"{what}: no such repo at {endpoint()}, or it is private and HF_TOKEN is not "
                              "allowed to read it") from None
    except HfHubHTTPError as exc:
        code = exc.response.status_code if exc.response is not None else "?"
        url = exc.response.url if exc.response is not None else None
        raise SparkstackError(f"{what}: {_answered(url)} answered HTTP {code}") from None
    except (transport_error, LocalEntryNotFoundError) as exc:
        raise SparkstackError(f"{what}: cannot reach {_answered(_request_url(exc))} ({_first_line(exc)})") from None
    except (json.JSONDecodeError, KeyError, TypeError) as exc:  # an answer huggingface_hub could not parse
        raise SparkstackError(f"{what}: the hub at {endpoint()} gave an answer that makes no sense "
                              f"({_first_line(exc)})") from None
    except ValueError as exc:  # huggingface_hub's own limits and checks: nothing the hub said
        raise SparkstackError(f"{what}: {_first_line(exc)}") from None
    except OSError as exc:  # a short body (huggingface_hub's size check), a full disk
        raise SparkstackError(f"{what}: {_first_line(exc)}") from None


def _api():
    _library()
    from huggingface_hub import HfApi

    return HfApi()


def current_commit(repo: str) -> str:
    """The commit the repo's default branch names now."""
    with hub_errors(f"{repo}@main"):
        sha = _api().model_info(repo).sha
    if not isinstance(sha, str) or not COMMIT.fullmatch(sha):
        raise SparkstackError(f"{repo}@main: the hub at {endpoint()} named no commit hash (got {str(sha)[:60]!r})")
    return sha


def _relpath_problem(path: object) -> str | None:
    if not isinstance(path, str) or not path or len(path) > 1024:
        return "is not a file path"
    parts = path.split("/")
    if path.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\\" in path or "\0" in path \
            or not path.isprintable():
        return "would land outside the snapshot"
    return None


def listing(repo: str, revision: str) -> tuple[ListedFile, ...]:
    """Every file of the commit, with the blob name the cache will give it and its size (one model_info call)."""
    what = f"{repo}@{revision}"
    with hub_errors(what):
        info = _api().model_info(repo, revision=revision, files_metadata=True)
    if info.sha != revision:
        raise SparkstackError(f"{what}: the hub at {endpoint()} answered for commit {str(info.sha)[:40]!r} instead")
    files = []
    for s in info.siblings or ():
        problem = _relpath_problem(s.rfilename)
        if problem:
            raise SparkstackError(f"{what}: the hub lists {str(s.rfilename)[:80]!r}, which {problem}")
        blob, size = (s.lfs.sha256, s.lfs.size) if s.lfs is not None else (s.blob_id, s.size)
        name_ok = isinstance(blob, str) and (SHA256 if s.lfs is not None else COMMIT).fullmatch(blob)
        if not name_ok or type(size) is not int or size < 0:
            raise SparkstackError(f"{what}: the hub lists {s.rfilename!r} without a usable hash and size")
        files.append(ListedFile(s.rfilename, blob, size))
    if not files:
        raise SparkstackError(f"{what}: the hub lists no files for this commit")
    if len({f.relpath for f in files}) != len(files):
        raise SparkstackError(f"{what}: the hub lists a file twice")
    return tuple(sorted(files, key=lambda f: f.relpath))


def _byte_counter(on_progress: Callable[[int], None]) -> type:
    """The few tqdm methods huggingface_hub calls on a download's bar, feeding `on_progress(bytes)`."""

    class Counter:
        def __init__(self, *args, **kwargs) -> None:
            pass

        def __enter__(self) -> Self:
            return self

        def __exit__(self, *exc) -> None:
            pass

        def update(self, n: float | None = 1) -> None:
            if n:
                on_progress(int(n))  # negative when a server ignored a Range and the bytes start over

        def update_transfer(self, n: float | None = 1) -> None:
            pass  # network bytes (xet); the bar counts bytes written, through update()

        def set_postfix_str(self, *args, **kwargs) -> None:
            pass

        set_transfer_postfix_str = set_postfix_str

        def close(self) -> None:
            pass

    return Counter


class _Capped:
    """The file http_get writes to, refusing to grow past the listed size: a server sending more fills no disk."""

    def __init__(self, out: BinaryIO, size: int, what: str, sender: str) -> None:
        self._out, self._size, self._what, self._sender = out, size, what, sender

    def write(self, data: bytes) -> int:
        if self._out.tell() + len(data) > self._size:
            raise SparkstackError(f"{self._what}: {self._sender} sent more than the {self._size} bytes the hub lists; "
                                  "stopped there, nothing kept")
        return self._out.write(data)

    def __getattr__(self, name: str):
        return getattr(self._out, name)  # seek, tell, truncate: http_get rewinds when a server ignores a Range


def download(repo: str, revision: str, f: ListedFile, blob: Path, on_progress: Callable[[int], None]) -> None:
    """One listed file's bytes into `blob`, through a temp file beside it, renamed when whole.

    huggingface_hub's hf_hub_download joins the hub's ETag into its blob path unchecked, so a hostile hub
    could have it write anywhere: the metadata is checked against the listing first, and the bytes go
    through huggingface_hub's http_get (which resumes a dropped body with a Range request) into a file
    named here."""
    _library()
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers

    what = f"{repo}@{revision}: {f.relpath}"
    url = hf_hub_url(repo, f.relpath, revision=revision)
    with hub_errors(what):
        meta = get_hf_file_metadata(url)
    if meta.commit_hash != revision:
        raise SparkstackError(f"{what}: the hub at {endpoint()} answered for commit {str(meta.commit_hash)[:40]!r} "
                              "instead; nothing written")
    if meta.etag != f.blob:
        raise SparkstackError(f"{what}: the hub at {endpoint()} names its blob {str(meta.etag)[:80]!r}, not the "
                              f"{f.blob} it lists; refused, nothing written")
    headers = build_hf_headers()
    if _origin(meta.location) != _origin(url):
        headers.pop("authorization", None)  # a signed CDN URL: the token stays with the hub, as huggingface_hub does
    partial = blob.with_name(f"{blob.name}.{uuid.uuid4().hex[:8]}.incomplete")
    try:
        with hub_errors(what), open(partial, "xb") as out:
            sender = "://".join(_origin(meta.location))
            http_get(meta.location, _Capped(out, f.size, what, sender), headers=headers, expected_size=f.size,
                     tqdm_class=_byte_counter(on_progress))
            out.flush()
            os.fsync(out.fileno())
        os.replace(partial, blob)
    finally:
        partial.unlink(missing_ok=True)
