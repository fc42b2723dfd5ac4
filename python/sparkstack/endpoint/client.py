"""One HTTP client (requests) for an OpenAI-compatible vLLM server: /health, /metrics, chat, streamed chat.

Streamed chats are timed on arrival: the first chunk (often role-only), the first chunk that carries generated
text (content, reasoning or a tool call), and every later such chunk, for TTFT, ITL and TPOT.
"""

from __future__ import annotations

import itertools
import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import requests
from requests.adapters import HTTPAdapter
from urllib3.exceptions import HTTPError, ReadTimeoutError

from sparkstack.endpoint import metrics, sse
from sparkstack.errors import SparkstackError, UsageError
from sparkstack.text import printable, quoted

REASONING_FIELDS = ("reasoning", "reasoning_content")  # current vLLM first, then older builds
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_key_env(name: str) -> str:
    """The name of the variable that holds the API key; never echoed (a key typed here must not reach a terminal)."""
    if not ENV_NAME.fullmatch(name):
        raise UsageError("--api-key-env takes the NAME of an environment variable (letters, digits, _), not a key")
    return name


def api_key_from(name: str, environ: Mapping[str, str]) -> str | None:
    """The API key from the variable `name` (checked first); None when it is unset or empty."""
    return environ.get(check_key_env(name)) or None


class EndpointError(SparkstackError):
    """A request that failed; `kind` groups failures for reports (connect, timeout, http_500, malformed, ...)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def base_url(url: str) -> str:
    """http(s)://host[:port][/prefix] without a trailing / or /v1; anything else is a usage error."""
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # e.g. an unclosed IPv6 bracket
        raise UsageError(f"not a URL: {printable(url)!r} ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"not an http(s) URL: {url!r} (e.g. http://127.0.0.1:8000)")
    try:
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise UsageError(f"bad port in URL: {url!r}") from None
    if parts.query or parts.fragment or parts.username or parts.password:
        raise UsageError(f"URL must not carry a query, fragment or credentials: {url!r}")
    path = parts.path.rstrip("/").removesuffix("/v1")
    return f"{parts.scheme}://{parts.netloc}{path}"


@dataclass(frozen=True)
class StreamResult:
    """One streamed chat completion, as received. Times are seconds since the request was sent."""
    first_chunk_s: float | None
    first_token_s: float | None
    end_s: float
    token_times_s: tuple[float, ...]  # arrival of each chunk that carried generated text
    content: str
    reasoning: str
    reasoning_field: str | None
    tool_calls: tuple[dict, ...]  # merged by index: {"id", "name", "arguments"}
    finish_reason: str | None
    usage: dict | None
    chunks: int
    logprobs: tuple[float, ...] = ()  # each sampled token's logprob, when the request asked for logprobs

    @property
    def output_tokens(self) -> int:
        """The server's count when it sent usage; otherwise one per text-carrying chunk (a lower bound)."""
        n = self.usage.get("completion_tokens") if self.usage else None
        if isinstance(n, int) and not isinstance(n, bool) and n >= 0:
            return n
        return len(self.token_times_s)

    @property
    def decode_s(self) -> float | None:
        """First generated text to last: the stream's decode time."""
        if not self.token_times_s:
            return None
        return self.token_times_s[-1] - self.token_times_s[0]

    @property
    def itls_s(self) -> tuple[float, ...]:
        t = self.token_times_s
        return tuple(b - a for a, b in itertools.pairwise(t))

    @property
    def tpot_s(self) -> float | None:
        """(last token - first token) / (output tokens - 1), as vLLM bench serve defines TPOT."""
        n = self.output_tokens
        if self.decode_s is None or n < 2:
            return None
        return self.decode_s / (n - 1)


@dataclass
class _Accumulator:
    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    reasoning_field: str | None = None
    tools: dict[int, dict] = field(default_factory=dict)
    finish_reason: str | None = None
    usage: dict | None = None
    logprobs: list[float] = field(default_factory=list)

    def add(self, chunk: dict) -> bool:
        """Fold one chunk in; True when it carried generated text."""
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        choices = chunk.get("choices")
        if not isinstance(choices, list):
            raise TypeError("no choices list")
        carried = False
        for choice in choices:
            delta = choice.get("delta") or {}
            if not isinstance(delta, dict):
                raise TypeError("delta is not an object")
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
            self.logprobs.extend(sampled_logprobs(choice))
            if isinstance(delta.get("content"), str) and delta["content"]:
                self.content.append(delta["content"])
                carried = True
            for name in REASONING_FIELDS:
                if isinstance(delta.get(name), str) and delta[name]:
                    self.reasoning.append(delta[name])
                    self.reasoning_field = self.reasoning_field or name
                    carried = True
            for call in delta.get("tool_calls") or []:
                index = call.get("index", 0)
                if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < 64:
                    raise ValueError(f"tool call index {index!r}")
                slot = self.tools.setdefault(index, {"id": None, "name": "", "arguments": ""})
                fn = call.get("function") or {}
                slot["id"] = call.get("id") or slot["id"]
                slot["name"] += fn.get("name") or ""
                slot["arguments"] += fn.get("arguments") or ""
                carried = True
        return carried


def sampled_logprobs(choice: dict) -> list[float]:
    """The logprob of each sampled token in a choice (streamed or not): `logprobs.content[*].logprob`."""
    lp = choice.get("logprobs")
    content = lp.get("content") if isinstance(lp, dict) else None
    if not isinstance(content, list):
        return []
    out = []
    for entry in content:
        v = entry.get("logprob") if isinstance(entry, dict) else None
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out.append(float(v))
    return out


class Endpoint:
    """One server. The API key comes from the caller (read from an environment variable, never argv)."""

    def __init__(self, url: str, api_key: str | None = None, timeout: float = 60.0, connections: int = 10) -> None:
        self.url = base_url(url)
        self.timeout = timeout
        self.session = requests.Session()
        self.session.trust_env = False  # no proxy or .netrc from the environment: the key goes only to this URL
        # one pooled connection per concurrent stream: beyond its pool, requests drops connections with a warning
        pool = HTTPAdapter(pool_maxsize=max(connections, 10))
        self.session.mount("http://", pool)
        self.session.mount("https://", pool)
        if api_key:
            self.session.headers["Authorization"] = f"Bearer {api_key}"

    def close(self) -> None:
        self.session.close()

    def _get(self, path: str, timeout: float | None = None) -> requests.Response:
        try:
            resp = self.session.get(self.url + path, timeout=timeout or self.timeout, allow_redirects=False)
        except requests.Timeout:
            raise EndpointError("timeout", f"{self.url}{path}: no answer in {timeout or self.timeout:g} s") from None
        except requests.RequestException as exc:
            raise EndpointError("connect", f"{self.url}{path}: cannot connect ({type(exc).__name__})") from None
        _refuse_redirect(resp, path)
        return resp

    def health(self, timeout: float = 5.0) -> tuple[bool, str]:
        """(healthy, detail). A refused connection is not healthy, not an error."""
        try:
            code = self.health_code(timeout)
        except EndpointError as exc:
            return False, str(exc)
        return code == 200, f"HTTP {code}"

    def health_code(self, timeout: float = 5.0) -> int:
        """/health's HTTP status, waiting at most `timeout` seconds; EndpointError when nothing answers."""
        return self._get("/health", timeout).status_code

    def scrape(self) -> metrics.Scrape | None:
        """/metrics parsed; None when the server has no /metrics (404)."""
        resp = self._get("/metrics")
        if resp.status_code == 404:
            return None
        if resp.status_code != 200:
            raise EndpointError(f"http_{resp.status_code}", f"{self.url}/metrics: HTTP {resp.status_code}")
        return metrics.parse(resp.text, time.monotonic())

    def models(self) -> list[str]:
        resp = self._get("/v1/models")
        doc = self._json(resp, "/v1/models")
        try:
            return [m["id"] for m in doc["data"]]
        except (KeyError, TypeError):
            raise EndpointError("malformed", f"{self.url}/v1/models: no model list in the answer") from None

    def _json(self, resp: requests.Response, path: str) -> dict:
        if resp.status_code != 200:
            raise EndpointError(f"http_{resp.status_code}",
                                f"{self.url}{path}: HTTP {resp.status_code}: {_error_message(resp)}")
        try:
            doc = resp.json()
        except ValueError:
            raise EndpointError("malformed", f"{self.url}{path}: answer is not JSON") from None
        if not isinstance(doc, dict):
            raise EndpointError("malformed", f"{self.url}{path}: answer is not a JSON object")
        return doc

    def chat(self, body: dict) -> dict:
        """One non-streamed chat completion: the whole answer document."""
        try:
            resp = self.session.post(self.url + "/v1/chat/completions", json=dict(body, stream=False),
                                     timeout=self.timeout, allow_redirects=False)
        except requests.Timeout:
            raise EndpointError("timeout", f"chat: no answer in {self.timeout:g} s") from None
        except requests.RequestException as exc:
            raise EndpointError("connect", f"chat: cannot connect to {self.url} ({type(exc).__name__})") from None
        _refuse_redirect(resp, "/v1/chat/completions")
        return self._json(resp, "/v1/chat/completions")

    def stream_chat(self, body: dict, deadline: float | None = None) -> StreamResult:
        """One streamed chat completion, timed chunk by chunk. It fails (one EndpointError) when no event comes for
        `timeout` seconds (keep-alive comments do not count), and at `deadline` (time.monotonic()) when given."""
        t0 = time.monotonic()
        acc = _Accumulator()
        first_chunk = first_token = None
        token_times: list[float] = []
        chunks = 0
        clock = _StreamClock(self.timeout, deadline)
        try:
            resp = self.session.post(self.url + "/v1/chat/completions", json=dict(body, stream=True), stream=True,
                                     timeout=clock.read_timeout(), allow_redirects=False,
                                     headers={"Accept": "text/event-stream", "Accept-Encoding": "identity"})
        except requests.Timeout:
            raise EndpointError("timeout", f"chat: no answer in {clock.read_timeout():.0f} s") from None
        except requests.RequestException as exc:
            raise EndpointError("connect", f"chat: cannot connect to {self.url} ({type(exc).__name__})") from None
        with resp:
            _refuse_redirect(resp, "/v1/chat/completions")
            if resp.status_code != 200:
                raise EndpointError(f"http_{resp.status_code}", f"chat: HTTP {resp.status_code}: {_error_message(resp)}")
            ctype = resp.headers.get("Content-Type", "")
            if not ctype.startswith("text/event-stream"):
                raise EndpointError("malformed", f"chat: asked for a stream, got HTTP 200 with Content-Type "
                                                 f"{printable(ctype) or 'none'!r}, not text/event-stream")
            done = False
            try:
                for data in sse.events(clock.watch(_arrivals(resp))):
                    clock.saw_event()
                    now = time.monotonic() - t0
                    if data == sse.DONE:
                        done = True
                        break
                    try:
                        chunk = json.loads(data)
                        if not isinstance(chunk, dict):
                            raise TypeError("not an object")
                        if "error" in chunk:
                            raise EndpointError("stream_error", f"chat: the stream sent an error: {quoted(data, 100)}")
                        carried = acc.add(chunk)
                    except (ValueError, TypeError, AttributeError, RecursionError, OverflowError):
                        raise EndpointError("malformed", "chat: a stream event is not a chat chunk: "
                                                         f"{quoted(data, 100)}") from None
                    chunks += 1
                    first_chunk = now if first_chunk is None else first_chunk
                    if carried:
                        first_token = now if first_token is None else first_token
                        token_times.append(now)
            except sse.LineTooLong as exc:
                raise EndpointError("malformed", f"chat: {exc}") from None
            except (requests.Timeout, ReadTimeoutError, TimeoutError):
                raise EndpointError("timeout", f"chat: no data for {clock.read_timeout():.0f} s") from None
            except requests.ConnectionError as exc:
                if _is_read_timeout(exc):
                    raise EndpointError("timeout", f"chat: no data for {clock.read_timeout():.0f} s") from None
                raise EndpointError("stream_cut", "chat: the connection broke mid-stream") from None
            except (requests.RequestException, HTTPError, OSError):
                raise EndpointError("stream_cut", "chat: the connection broke mid-stream") from None
            if not done:
                raise EndpointError("stream_cut", "chat: the stream ended without [DONE]")
        tools = tuple(acc.tools[i] for i in sorted(acc.tools))
        return StreamResult(first_chunk, first_token, time.monotonic() - t0, tuple(token_times), "".join(acc.content),
                            "".join(acc.reasoning), acc.reasoning_field, tools, acc.finish_reason, acc.usage, chunks,
                            tuple(acc.logprobs))


class _StreamClock:
    """How long a stream may stay silent: `timeout` between events (comments are not events), and an overall
    deadline. Checked on every arrival of bytes, so a drip of keep-alive comments cannot hold a stream open."""

    def __init__(self, timeout: float, deadline: float | None) -> None:
        self.timeout = timeout
        self.deadline = deadline
        self.last_event = time.monotonic()

    def read_timeout(self) -> float:
        left = self.deadline - time.monotonic() if self.deadline is not None else self.timeout
        return max(0.1, min(self.timeout, left))

    def saw_event(self) -> None:
        self.last_event = time.monotonic()

    def watch(self, chunks):
        for chunk in chunks:
            now = time.monotonic()
            if now - self.last_event > self.timeout:
                raise EndpointError("timeout", f"chat: no event for {self.timeout:.0f} s (only keep-alive comments)")
            if self.deadline is not None and now > self.deadline:
                raise EndpointError("timeout", "chat: the stream ran past the deadline")
            yield chunk


def _is_read_timeout(exc: BaseException) -> bool:
    """requests wraps urllib3's ReadTimeoutError in a ConnectionError while a streamed body is read."""
    return any(isinstance(a, (ReadTimeoutError, TimeoutError)) for a in exc.args)


def _refuse_redirect(resp: requests.Response, path: str) -> None:
    """A redirect is not followed: the key must not travel, and a check must not pass against another server."""
    if resp.is_redirect or 300 <= resp.status_code < 400:
        where = printable(resp.headers.get("Location", "nowhere"))
        raise EndpointError(f"http_{resp.status_code}", f"{path}: HTTP {resp.status_code} redirect to {where!r} "
                                                        "(not followed: give that URL instead)")


def _arrivals(resp: requests.Response):
    """Bytes as they arrive: per HTTP chunk when chunked (vLLM's uvicorn), else whatever one read returns
    (iter_content(None) would wait for the whole body of a non-chunked stream)."""
    if resp.raw.chunked:
        return resp.iter_content(chunk_size=None)
    return iter(lambda: resp.raw.read1(65536), b"")


def _error_message(resp: requests.Response) -> str:
    """The server's own error message when it sent one (OpenAI's {"error": {"message"}} or FastAPI's detail)."""
    try:
        doc = resp.json()
        err = doc.get("error", doc.get("detail"))
        msg = err.get("message") if isinstance(err, dict) else err
        if isinstance(msg, str) and msg:
            return printable(msg if len(msg) <= 160 else msg[:157] + "...")
    except (ValueError, AttributeError, RecursionError):
        pass
    return printable(resp.reason or "no message")
