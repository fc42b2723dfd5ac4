"""What `verify` asks a served endpoint, as data: each check is a name, whether it is required, one line saying
what it asks (for --dry-run), and a probe. A probe returns its pass detail, or raises `CheckFailed` (or the
client's EndpointError) with the failure detail; the runner (run.py) turns that into pass, warn or fail.

Prompts are fixed so that runs compare. Token budgets leave room for a reasoning model (GLM's glm45 parser) to
think before it answers or calls the tool.
"""

from __future__ import annotations

import base64
import json
import struct
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass

from sparkstack.endpoint import metrics, stats
from sparkstack.endpoint.client import REASONING_FIELDS, Endpoint, EndpointError, StreamResult, sampled_logprobs
from sparkstack.errors import SparkstackError
from sparkstack.launch.preflight import CHAT_TEMPLATE


class CheckFailed(Exception):
    """A check's failure detail, one line."""


class OutOfTime(CheckFailed):
    """The run's --timeout ran out before or during this check."""


MIN_CHECK_S = 0.5  # less of the --timeout left than this, and the next check is not run


class Session:
    """What the checks share during one run: the endpoint, the model asked, the deadline, and whether the server
    was found unreachable (then the later checks are not run)."""

    def __init__(self, endpoint: Endpoint, model: str | None, timeout_s: float, temperature: float = 1.0) -> None:
        self._endpoint = endpoint
        self.url = endpoint.url
        self.model = model
        self.temperature = temperature
        self.timeout_s = timeout_s
        self.deadline = time.monotonic() + timeout_s
        self.unreachable: str | None = None

    def left_s(self) -> float:
        return self.deadline - time.monotonic()

    def endpoint(self) -> Endpoint:
        """The endpoint, its per-request timeout cut to what is left of the run's, so that --timeout bounds the run.
        The Endpoint is this run's own (run_verify makes it): its chat calls take no per-request timeout, so the
        attribute is set. Tenths of a second: the failure line says "no answer in 3 s", not "in 2.99561 s"."""
        left = self.left_s()
        # A sliver of the budget is not a check: one that hung to the deadline leaves a few ms, more or less by the
        # machine's load, and the next check would fail "in 0 s" instead of being not run.
        if left < MIN_CHECK_S:
            raise OutOfTime(f"the --timeout of {self.timeout_s:g} s ran out")
        self._endpoint.timeout = max(0.1, round(left, 1))
        return self._endpoint

    def body(self, content: str | list, max_tokens: int, **extra) -> dict:
        return {"model": self.model, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
                **extra}


@dataclass(frozen=True)
class VerifyCheck:
    name: str
    required: bool
    asks: str  # what it sends and expects, one line
    probe: Callable[[Session], str]
    needs_model: bool = True

    def to_json(self) -> dict:
        return {"check": self.name, "required": self.required, "asks": self.asks}


# ---------------------------------------------------------------- fixed inputs

CHAT_PROMPT = "In one short sentence: what is a lighthouse for?"
SPEC_PROMPT = "Write a short paragraph on how a lighthouse lens focuses light."
REASONING_PROMPT = "What is 17 * 23? Think it through, then give the number alone."
TOOL_NAME = "get_weather"
TOOL_ARGS = {"city": "Paris", "unit": "celsius"}
TOOL_PROMPT = f"What is the weather like? Call {TOOL_NAME} with exactly these arguments: {json.dumps(TOOL_ARGS)}"
TOOLS = [{"type": "function", "function": {
    "name": TOOL_NAME, "description": "The current weather in a city.",
    "parameters": {"type": "object", "required": ["city", "unit"], "properties": {
        "city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}}}}]
TOOL_MARKUP = ("<tool_call>", "</tool_call>")
THINK_MARKUP = ("<think>", "</think>")
# Chinese, Russian and Japanese: multi-byte tokens are where corrupted token ids (vLLM #54150) show as U+FFFD.
FFFD_PROMPT = ("请把这句话原样重复一遍：「春眠不觉晓，处处闻啼鸟。」 Затем переведи её на русский язык. "
               "最後に日本語で一度だけ書いてください。")
FFFD_PASSES = 3
# Long enough to fill whole KV blocks even at --block-size 2304: vLLM's prefix cache hits only whole blocks.
LONG_PROMPT = "Read this list, then reply with the single word ok.\n" + "\n".join(
    f"{i}. Lighthouse number {i} stands on a rocky point and turns its lamp once every {i % 7 + 3} seconds."
    for i in range(1, 401))
IMAGE_PROMPT = "What colour fills this image? One word."
SAMPLING_TOKENS = 64
# Answers the sampling check asks for in one request ("n"): an engine fault that corrupts some answers and not
# others (vLLM 0.32 CPU's at TP=2 under a drafter: about 65 % of single answers, measured in the lab's real pair)
# slips past one answer, and is caught by eight, at the cost of one batched request.
SAMPLING_ANSWERS = 8
GREEDY_BELOW = 1e-5  # vLLM samples greedily below this temperature, and there refuses "n" > 1
TEXT_PREVIEW = 40


def solid_png(width: int, height: int, rgb: tuple[int, int, int]) -> bytes:
    """A PNG of one colour (8-bit RGB, no filter), written with the standard library."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + bytes(rgb) * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


IMAGE_PNG = solid_png(64, 64, (220, 30, 30))


# ---------------------------------------------------------------- reading answers

def _preview(text: str) -> str:
    text = " ".join(text.split())
    return repr(text if len(text) <= TEXT_PREVIEW else text[:TEXT_PREVIEW - 3] + "...")


def _message(doc: dict) -> tuple[dict, str | None]:
    """choices[0].message and its finish_reason, or a failure naming what is missing."""
    choices = doc.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise CheckFailed("the answer has no choices")
    message = choices[0].get("message")
    if not isinstance(message, dict):
        raise CheckFailed("the answer's choices[0] has no message")
    return message, choices[0].get("finish_reason")


def _text(message: dict, *fields: str) -> str:
    return "".join(v for f in fields if isinstance(v := message.get(f), str))


def _scrape(session: Session) -> metrics.Scrape:
    scrape = session.endpoint().scrape()
    if scrape is None:
        raise CheckFailed("the server has no /metrics (HTTP 404)")
    return scrape


# ---------------------------------------------------------------- probes

def probe_health(session: Session) -> str:
    healthy, detail = session.endpoint().health(timeout=min(5.0, session.left_s()))
    if not healthy:  # detail: "HTTP 503", or why no answer came (it names the URL)
        raise CheckFailed(f"GET /health: {detail}" if detail.startswith("HTTP ") else detail)
    return f"GET /health: {detail}"


class NoModelServed(SparkstackError):
    """/v1/models lists nothing to ask."""


def served_models(endpoint: Endpoint) -> list[str]:
    """The ids /v1/models lists; the first is the one asked when no --model is given (verify, bench). An empty
    list is an error naming the URL."""
    served = endpoint.models()
    if not served:
        raise NoModelServed(f"{endpoint.url}/v1/models lists no model (name one with --model)")
    return served


def probe_models(session: Session) -> str:
    served = served_models(session.endpoint())
    if session.model is None:
        session.model = served[0]
        return f"asking {session.model} (the first of {len(served)} served)"
    if session.model not in served:
        raise CheckFailed(f"{session.model!r} is not served; /v1/models lists {', '.join(map(repr, served[:5]))}")
    return f"asking {session.model} (served)"


def probe_chat(session: Session) -> str:
    message, finish = _message(session.endpoint().chat(session.body(CHAT_PROMPT, 256)))
    content = _text(message, "content")
    if not content and not _text(message, *REASONING_FIELDS):
        raise CheckFailed(f"the answer carries no text (finish_reason {finish!r})")
    return f"finish_reason {finish}, content {_preview(content)}"


def probe_stream_usage(session: Session) -> str:
    r = session.endpoint().stream_chat(session.body(CHAT_PROMPT, 256, stream_options={"include_usage": True}))
    if r.first_token_s is None:
        raise CheckFailed(f"{r.chunks} chunks and [DONE], but no text")
    tokens = (r.usage or {}).get("completion_tokens")
    if not isinstance(tokens, int) or isinstance(tokens, bool):
        raise CheckFailed(f"no usage chunk before [DONE] ({r.chunks} chunks; stream_options.include_usage was asked)")
    return f"{r.chunks} chunks, then usage ({tokens} completion tokens) and [DONE]"


def probe_tool_call(session: Session) -> str:
    r = session.endpoint().stream_chat(session.body(TOOL_PROMPT, 1024, tools=TOOLS, tool_choice="auto"))
    problems = []
    if r.finish_reason != "tool_calls":
        problems.append(f"finish_reason {r.finish_reason!r}, not 'tool_calls'")
    if len(r.tool_calls) != 1:
        problems.append(f"{len(r.tool_calls)} tool calls, not 1")
    else:
        call = r.tool_calls[0]
        if call["name"] != TOOL_NAME:
            problems.append(f"called {call['name']!r}, not {TOOL_NAME!r}")
        try:
            args = json.loads(call["arguments"])
        except ValueError:
            problems.append(f"arguments are not JSON: {_preview(call['arguments'])}")
        else:
            if args != TOOL_ARGS:
                problems.append(f"arguments {json.dumps(args)[:80]}, not {json.dumps(TOOL_ARGS)}")
    if any(tag in r.content for tag in TOOL_MARKUP):
        problems.append("<tool_call> markup leaked into content (is --tool-call-parser glm47 set?)")
    if problems:
        raise CheckFailed("; ".join(problems))
    return f"{TOOL_NAME}({r.tool_calls[0]['arguments']}), finish_reason tool_calls"


def _reasoning_leak(r: StreamResult) -> str | None:
    tags = [tag for tag in THINK_MARKUP if tag in r.content]
    if tags:
        return f"{'/'.join(tags)} markup in content: reasoning leaked into the answer (is --reasoning-parser set?)"
    return None


def probe_reasoning(session: Session) -> str:
    """Kept apart: reasoning comes only in `reasoning` (or `reasoning_content`), and content carries no think
    markup. An answer without reasoning passes when its content is free of that markup: the model may not think."""
    r = session.endpoint().stream_chat(session.body(REASONING_PROMPT, 1024))
    leak = _reasoning_leak(r)
    if leak:
        raise CheckFailed(leak)
    if not r.reasoning:
        return f"no reasoning in this answer; content {_preview(r.content)} carries no think markup"
    return f"{len(r.reasoning)} chars of reasoning in `{r.reasoning_field}`, content apart: {_preview(r.content)}"


def probe_spec_decode(session: Session) -> str:
    """Greedy (temperature 0): how many drafts the target accepts then depends on the drafter and the engine, not
    on a random draw, so the verdict is the same on every run. At temperature 1 a weak drafter's acceptance swings
    with the sampled text (1.03 in one run, 1.72 in the next, on the same real pair); the sampling check is the one
    that asks at the serving temperature."""
    before = _scrape(session)
    if not metrics.has_spec(before):
        raise CheckFailed(f"no spec-decode counters on /metrics ({metrics.DRAFTS}): speculative decoding is off")
    r = session.endpoint().stream_chat(session.body(SPEC_PROMPT, 256, temperature=0))
    delta = metrics.spec_delta(before, _scrape(session))
    if delta is None:
        raise CheckFailed(f"the spec-decode counters ({metrics.DRAFTS}) went away after a request")
    if delta.drafts <= 0:
        raise CheckFailed(f"no drafts during a {r.output_tokens}-token answer: the drafter is not running")
    if delta.collapsed:
        rejected = "every draft rejected" if delta.accepted == 0 else "nearly every draft rejected"
        raise CheckFailed(f"acceptance length {delta.acceptance_length:.2f} over {delta.drafts:g} drafts: "
                          f"{rejected} (vLLM #53030)")
    rates = "/".join(f"{p:.2f}" for p in delta.per_position)
    return (f"acceptance length {delta.acceptance_length:.2f} over {delta.drafts:g} drafts"
            + (f", per position {rates}" if rates else ""))


def probe_sampling(session: Session) -> str:
    """Each sampled token's logprob at the serving temperature, over SAMPLING_ANSWERS answers (one when greedy:
    greedy answers are one answer): honest sampling does not draw a token whose probability is below
    stats.implausible_logprob(n) in a run of n tokens (the derivation is in endpoint.stats). Fewer answers than
    asked is no verdict, and more are not read: a padded reply would lower the line."""
    asked = SAMPLING_ANSWERS if session.temperature >= GREEDY_BELOW else 1
    doc = session.endpoint().chat(session.body(SPEC_PROMPT, SAMPLING_TOKENS, temperature=session.temperature,
                                               logprobs=True, n=asked))
    choices = doc.get("choices")
    choices = choices[:asked] if isinstance(choices, list) else []
    answers = [sampled_logprobs(c) if isinstance(c, dict) else [] for c in choices]
    judged = sum(1 for a in answers if a)
    if judged < asked:
        raise CheckFailed(f"{judged} of the {asked} answer(s) asked came back with logprobs (asked with "
                          f"\"logprobs\": true, \"n\": {asked}): no verdict on the server's sampling")
    logprobs = [v for a in answers for v in a]
    cut = stats.implausible_logprob(len(logprobs), session.temperature)
    bad = stats.implausible_tokens(logprobs, session.temperature)
    at = f"at temperature {session.temperature:g}"
    of = f"{len(logprobs)} sampled tokens in {asked} answer{'s' if asked != 1 else ''}"
    if bad:
        hit = sum(1 for a in answers if stats.implausible_tokens(a, session.temperature, len(logprobs)))
        raise CheckFailed(f"{bad} of {of} {at} have logprob below {cut:.1f} (in {hit} of the answers; lowest "
                          f"{min(logprobs):.1f}): honest sampling does not draw them; the server corrupts samples")
    return f"{of} {at}, lowest logprob {min(logprobs):.1f} (threshold {cut:.1f})"


def probe_image(session: Session) -> str:
    url = "data:image/png;base64," + base64.b64encode(IMAGE_PNG).decode()
    parts = [{"type": "text", "text": IMAGE_PROMPT}, {"type": "image_url", "image_url": {"url": url}}]
    hint = f"image parts need {CHAT_TEMPLATE} in the weights dir"
    try:
        message, finish = _message(session.endpoint().chat(session.body(parts, 256)))
    except EndpointError as exc:
        if exc.kind.startswith("http_"):
            raise CheckFailed(f"{exc}; {hint}") from None
        raise
    content = _text(message, "content")
    if not content and not _text(message, *REASONING_FIELDS):
        raise CheckFailed(f"no text for an image part (finish_reason {finish!r}); {hint}")
    return f"answered an image part: {_preview(content)}"


def probe_fffd(session: Session) -> str:
    found, affected, chars = 0, 0, 0
    for _ in range(FFFD_PASSES):
        message, _ = _message(session.endpoint().chat(session.body(FFFD_PROMPT, 256, temperature=0)))
        text = _text(message, "content", *REASONING_FIELDS)
        chars += len(text)
        found += text.count("\ufffd")
        affected += "\ufffd" in text
    if found:
        raise CheckFailed(f"{found} U+FFFD in {affected} of {FFFD_PASSES} passes: corrupted token ids "
                          "(vLLM #54150, intermittent)")
    return f"no U+FFFD in {FFFD_PASSES} passes ({chars} chars) at temperature 0"


def probe_prefix_cache(session: Session) -> str:
    before = _scrape(session)
    if before.get(metrics.PREFIX_HITS) is None:
        raise CheckFailed(f"no {metrics.PREFIX_HITS} on /metrics")
    for _ in range(2):
        usage = session.endpoint().chat(session.body(LONG_PROMPT, 1)).get("usage")
    prompt_tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    after = _scrape(session)
    hits = (after.get(metrics.PREFIX_HITS) or 0.0) - before.get(metrics.PREFIX_HITS)
    queries = (after.get(metrics.PREFIX_QUERIES) or 0.0) - (before.get(metrics.PREFIX_QUERIES) or 0.0)
    size = f"a {prompt_tokens}-token prompt" if isinstance(prompt_tokens, int) else "a long prompt"
    if hits <= 0:
        raise CheckFailed(f"sending {size} twice raised no {metrics.PREFIX_HITS} "
                          "(is --enable-prefix-caching on?)")
    return f"sending {size} twice: +{hits:g} hit tokens of +{queries:g} queried"


CHECKS: tuple[VerifyCheck, ...] = (
    VerifyCheck("health", True, "GET /health answers 200", probe_health, needs_model=False),
    VerifyCheck("models", True, "GET /v1/models lists the model (--model, else the first listed is asked)", probe_models,
          needs_model=False),
    VerifyCheck("chat", True, "a chat completion answers with text", probe_chat),
    VerifyCheck("stream-usage", True, "a streamed chat ends with a usage chunk (stream_options.include_usage) and [DONE]",
          probe_stream_usage),
    VerifyCheck("tool-call", True, f'tool_choice "auto": finish_reason tool_calls, one call to {TOOL_NAME} with '
          f"{json.dumps(TOOL_ARGS)}, no <tool_call> markup in content", probe_tool_call),
    VerifyCheck("reasoning", True, "reasoning only in `reasoning`/`reasoning_content`, no think markup in content",
          probe_reasoning),
    VerifyCheck("spec-decode", True, "after a greedy streamed chat (temperature 0), /metrics shows drafts > 0 and "
          "acceptance length > 1.05",
          probe_spec_decode),
    VerifyCheck("sampling", True, f"{SAMPLING_ANSWERS} answers (one when greedy) of {SAMPLING_TOKENS} tokens "
          "at the serving temperature with logprobs: none below "
          "the bound honest sampling keeps (endpoint.stats.implausible_logprob)", probe_sampling),
    VerifyCheck("image", False, f"a chat with an image part answers (else {CHAT_TEMPLATE} is missing)", probe_image),
    VerifyCheck("fffd", False, f"a fixed non-Latin prompt at temperature 0, {FFFD_PASSES} passes: no U+FFFD (vLLM #54150)",
          probe_fffd),
    VerifyCheck("prefix-cache", False, f"a long prompt sent twice raises {metrics.PREFIX_HITS}", probe_prefix_cache),
)
