"""A STAND-IN for the vLLM engine, for the two-host lab and the unit tests. It serves no model.

As a script (inside a lab container) it takes the engine's argv as vLLM would, and:
- records its argv and environment (secrets as a sha256 prefix) as JSON to $STANDIN_RECORD (default /tmp/standin-record.json);
- prints log lines like the engine's, including the boot lines launch looks for;
- serves /health after $STANDIN_HEALTH_DELAY seconds, or never ("never"), or dies instead ("die");
- dies with a fatal boot line when its argv holds what $STANDIN_DIE_ON names (`die_on`): one knob value's boot
  fails while the others serve (sweep's lab test);
- as a headless rank, dies after $STANDIN_HEADLESS_DIE_AFTER seconds when that is set;
- serves /metrics and /v1/chat/completions as `Behaviour` (below) says, from STANDIN_* variables.
Unit tests run the same server in-process: `Engine(Behaviour(...)).start()`.

Decoding is simulated step by step, as vLLM's spec decode does it: the first output token comes from the prefill;
each later step is one draft of `num_speculative_tokens` tokens (n) of which the acceptance pattern's next count is
accepted (at most n: a count above n accepts the whole draft), so the step emits accepted + 1 tokens and advances
the counters exactly as vLLM defines them (drafts += 1, draft_tokens += n, accepted += a, accepted_per_pos[i] += 1
for every i < a). Each request starts the pattern afresh and runs `cycles` whole passes of it, so a block's figures
follow from the pattern and n alone.
Only the Python standard library is used: it runs on any base with python3.
"""

import dataclasses
import hashlib
import json
import os
import re
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BOOT_LINES = [
    "Detected ModelOpt NVFP4 checkpoint (quant_algo=NVFP4)",
    "Using 'MARLIN' NvFp4 MoE backend",
    "Using Eagle3 auxiliary layers from config: (6, 15, 25, 34, 43)",
    "GPU KV cache size: 989,727 tokens",
    "Breakable CUDA graph enabled",
    "Graph capturing finished",
]
WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo")


def for_this_rank(name, default):
    """$name as JSON: an object is keyed by --node-rank, anything else holds for every rank."""
    raw = os.environ.get(name)
    value = json.loads(raw) if raw else default
    return value.get(arg("--node-rank", "0"), default) if isinstance(value, dict) else value


def boot_script():
    """$STANDIN_BOOT_SCRIPT: [[delay_s, line], ...] printed verbatim (the test gives vLLM's prefixes), default
    BOOT_LINES; then $STANDIN_DIE_WITH's line, if set, and exit 1. Both may be keyed by rank (for_this_rank)."""
    default = [[0, f"INFO {time.strftime('%m-%d %H:%M:%S')} [standin] {line}"] for line in BOOT_LINES]
    return for_this_rank("STANDIN_BOOT_SCRIPT", default)


def die_on():
    """$STANDIN_DIE_ON: {"ARG": line, ...}; the line of the first ARG this rank's argv holds, else None. ARG is an
    argv element ("--enforce-eager") or FLAG=VALUE, which holds when the element after FLAG is VALUE
    ("--gpu-memory-utilization=0.95"). The line is printed after the boot script and the engine exits 1, as with
    $STANDIN_DIE_WITH: so a recipe's [env] can make the boot of one knob value fail and leave the others serving."""
    raw = os.environ.get("STANDIN_DIE_ON")
    for want, line in (json.loads(raw) if raw else {}).items():
        flag, eq, value = want.partition("=")
        if (arg(flag) == value) if eq else want in sys.argv[1:]:
            return line
    return None


def arg(name, default=None):
    argv = sys.argv[1:]
    return argv[argv.index(name) + 1] if name in argv and argv.index(name) + 1 < len(argv) else default


def log(msg):
    print(f"INFO {time.strftime('%m-%d %H:%M:%S')} [standin] {msg}", flush=True)


def spec_tokens():
    raw = arg("--speculative-config")
    try:
        return int(json.loads(raw)["num_speculative_tokens"]) if raw else 4
    except (ValueError, KeyError, TypeError):
        return 4


@dataclasses.dataclass(frozen=True)
class Behaviour:
    """What the stand-in does. Every field has a STANDIN_<FIELD> variable (see `from_env`)."""
    model: str = "standin"
    spec_tokens: int = 4
    accept_pattern: tuple = (4, 2, 1, 0)  # accepted drafts per step, cycling; (0,) is vLLM #53030's fault
    cycles: int = 3                       # whole passes of the pattern per request (then finish_reason "stop")
    step_delay: float = 0.002             # seconds per decode step
    delay_sequence: tuple = ()            # step delay per burst (a burst starts when a request finds the engine idle)
    role_delay: float = 0.0               # seconds between the role-only first chunk and the first token
    reasoning_tokens: int = 0             # tokens of reasoning before the content
    reasoning_field: str = "reasoning"    # or the older "reasoning_content"
    reasoning_fault: str = ""             # "merge": reasoning leaks into content inside <think> markup
    tool_fault: str = ""                  # "leak": <tool_call> markup in content; "args": wrong arguments
    no_usage: bool = False                # ignore stream_options.include_usage
    no_mm: bool = False                   # refuse image parts, as vLLM does without chat_template_mm.jinja
    fffd: bool = False                    # a U+FFFD in every content (vLLM #54150's symptom)
    metrics: str = "full"                 # "full", "no-spec" (no spec-decode counters), "none" (404), "http500"
                                          # or "garbage" (200 with text that is not Prometheus exposition)
    prefix_cache: bool = True             # a repeated prompt counts as prefix-cache hits
    busy: int = 0                         # requests reported running besides our own
    fail_every: int = 0                   # every n-th chat request answers HTTP 500
    echo_auth: bool = False               # that HTTP 500 echoes the Authorization header, as careless servers do
    malformed: bool = False               # streams send a chunk that is not JSON
    hang: bool = False                    # chat requests never answer
    counters: tuple = ()                  # (name, value) pairs the counters start from
    api_key: str = ""                     # /v1/ requests need "Authorization: Bearer <key>", as vLLM's --api-key
    step_delay_per_request: float = 0.0   # added to each step per running request: a bigger batch steps slower
    burst: bool = False                   # hold a stream's chunks and send them at once at its end, as a lagging
                                          # API server does (the engine still times the decode: its histograms)
    logprob: float = -0.5                 # each sampled token's logprob, when a request asks for logprobs
    corrupt_every: int = 0                # every n-th sampled token comes back with logprob -113.0, as
                                          # vLLM 0.32 CPU's do under speculative decoding at temperature 1
    most_answers: int = 0                 # answer at most this many of the "n" asked (0: all), as a server
                                          # that ignores "n" does
    corrupt_answer: int | None = None     # with "n" answers asked, only this one (its index) is corrupted, as
                                          # the real pair's fault spares some answers and not others
    histograms: bool = True               # vLLM's per-request timing histograms (decode time, ITL, TPOT)

    @classmethod
    def from_env(cls, env) -> "Behaviour":
        kinds = {f.name: getattr(f.type, "__name__", f.type) for f in dataclasses.fields(cls)}  # a type, not its name
        given = {}
        for name, kind in kinds.items():
            raw = env.get("STANDIN_" + name.upper())
            if raw is None or raw == "":
                continue
            if kind == "tuple" and name == "counters":
                given[name] = tuple(json.loads(raw).items())
            elif kind == "tuple":
                given[name] = tuple((float if name == "delay_sequence" else int)(x) for x in raw.split(","))
            elif kind == "bool":
                given[name] = raw not in ("0", "false", "no")
            else:
                given[name] = {"int": int, "int | None": int, "float": float}.get(kind, str)(raw)
        return cls(**given)


def _usage(prompt_tokens, completion_tokens):
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _first_json_object(text):
    """The first {...} in a prompt that parses as JSON: what the tool call's arguments should be."""
    for m in re.finditer(r"\{", text):
        try:
            obj, _ = json.JSONDecoder().raw_decode(text[m.start():])
            return obj
        except ValueError:
            continue
    return {}


def _prompt_text(messages):
    parts = []
    for m in messages if isinstance(messages, list) else []:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts += [p.get("text", "") for p in content if isinstance(p, dict)]
    return "\n".join(parts)


def _has_image(messages):
    return any(isinstance(p, dict) and p.get("type") == "image_url"
               for m in (messages if isinstance(messages, list) else []) if isinstance(m, dict)
               for p in (m.get("content") if isinstance(m.get("content"), list) else []))


class ClientGone(Exception):
    """The client hung up mid-stream: stop decoding for it."""


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], (ConnectionError, OSError)):  # a client hanging up is not news
            super().handle_error(request, client_address)


class Engine:
    """The serving state: counters, running requests and bursts, behind one lock."""

    def __init__(self, behaviour=None):
        self.b = behaviour or Behaviour()
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.c = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "prompt_tokens": 0, "generation_tokens": 0,
                  "prefix_queries": 0, "prefix_hits": 0, "preemptions": 0, "requests": 0}
        # vLLM's per-request histograms, as _sum and _count: decode time, generated tokens, ITL (per step), TPOT
        self.h = {"decode": [0.0, 0], "tokens": [0.0, 0], "itl": [0.0, 0], "tpot": [0.0, 0]}
        self.c.update(dict(self.b.counters))
        self.per_pos = [0] * self.b.spec_tokens
        self.running = 0
        self.bursts = -1
        self.seen_prompts = set()
        self.server = None
        self.started = time.monotonic()
        self.health_after = 0.0  # seconds after start; None: never healthy
        self.unhealthy = False   # a test flips it to make /health flap
        self.requests_seen = []  # (method, path, Authorization header or None) of every request, in order
        self.chat_bodies = []    # every chat request's parsed JSON body, in order
        self.connections = set()  # open client sockets: a stop closes them, as a dying engine's would close

    # -- bookkeeping
    def admit(self, prompt):
        with self.lock:
            self.c["requests"] += 1
            if self.running == 0:
                self.bursts += 1
            self.running += 1
            tokens = max(1, len(prompt) // 4)
            self.c["prompt_tokens"] += tokens
            self.c["prefix_queries"] += tokens
            if self.b.prefix_cache and prompt in self.seen_prompts:
                self.c["prefix_hits"] += tokens
            self.seen_prompts.add(prompt)
            seq = self.b.delay_sequence
            delay = seq[self.bursts % len(seq)] if seq else self.b.step_delay
            return self.c["requests"], tokens, delay

    def leave(self):
        with self.lock:
            self.running -= 1

    def record_step(self, accepted):
        with self.lock:
            self.c["drafts"] += 1
            self.c["draft_tokens"] += self.b.spec_tokens
            self.c["accepted"] += accepted
            for i in range(min(accepted, self.b.spec_tokens)):
                self.per_pos[i] += 1

    def record_tokens(self, n):
        with self.lock:
            self.c["generation_tokens"] += n

    def record_request(self, step_times, tokens):
        """A finished request, observed as vLLM's engine observes it: decode from first token to last."""
        with self.lock:
            decode = step_times[-1] - step_times[0] if step_times else 0.0
            for name, value in (("decode", decode), ("tokens", tokens)):
                self.h[name][0] += value
                self.h[name][1] += 1
            for a, b in zip(step_times, step_times[1:]):
                self.h["itl"][0] += b - a
                self.h["itl"][1] += 1
            if tokens > 1:
                self.h["tpot"][0] += decode / (tokens - 1)
                self.h["tpot"][1] += 1

    # -- decoding
    def steps(self, max_tokens, delay):
        """Yield each step's tokens: the prefill's one token, then accepted + 1 per draft, until the cycles or
        max_tokens end. Counters move before the step's tokens are sent, as the engine's do."""
        pattern = self.b.accept_pattern
        budget = max(1, max_tokens)
        yield 1
        sent = 1
        for k in range(len(pattern) * self.b.cycles):
            if sent >= budget or self.stopping.is_set():
                return
            time.sleep(delay + self.b.step_delay_per_request * self.running)
            a = min(pattern[k % len(pattern)], self.b.spec_tokens)  # a draft of n tokens accepts at most n
            self.record_step(a)
            n = min(a + 1, budget - sent)
            sent += n
            yield n

    def metrics_text(self):
        """The exposition prometheus_client writes for vLLM's metrics: counters under their `_total` names."""
        if self.b.metrics == "none":
            return None
        with self.lock:
            c, per_pos, running = dict(self.c), list(self.per_pos), self.running + self.b.busy
        labels = {"model_name": self.b.model, "engine": "0"}
        families = [
            ("vllm:num_requests_running", "gauge", [({}, running)]),
            ("vllm:num_requests_waiting", "gauge", [({}, 0)]),
            ("vllm:kv_cache_usage_perc", "gauge", [({}, min(1.0, running / 64))]),
            ("vllm:prefix_cache_queries", "counter", [({}, c["prefix_queries"])]),
            ("vllm:prefix_cache_hits", "counter", [({}, c["prefix_hits"])]),
            ("vllm:prompt_tokens", "counter", [({}, c["prompt_tokens"])]),
            ("vllm:generation_tokens", "counter", [({}, c["generation_tokens"])]),
            ("vllm:num_preemptions", "counter", [({}, c["preemptions"])]),
        ]
        if self.b.metrics != "no-spec":
            families += [
                ("vllm:spec_decode_num_drafts", "counter", [({}, c["drafts"])]),
                ("vllm:spec_decode_num_draft_tokens", "counter", [({}, c["draft_tokens"])]),
                ("vllm:spec_decode_num_accepted_tokens", "counter", [({}, c["accepted"])]),
                ("vllm:spec_decode_num_accepted_tokens_per_pos", "counter",
                 [({"position": str(i)}, v) for i, v in enumerate(per_pos)]),
            ]
        lines = []
        if self.b.histograms:
            with self.lock:
                h = {k: list(v) for k, v in self.h.items()}
            for name, key in (("vllm:request_decode_time_seconds", "decode"),
                              ("vllm:request_generation_tokens", "tokens"), ("vllm:inter_token_latency_seconds", "itl"),
                              ("vllm:request_time_per_output_token_seconds", "tpot")):
                text = ",".join(f'{k}="{v}"' for k, v in labels.items())
                lines += [f"# HELP {name} {name} (stand-in)", f"# TYPE {name} histogram",
                          f'{name}_bucket{{{text},le="+Inf"}} {float(h[key][1])}',
                          f"{name}_count{{{text}}} {float(h[key][1])}", f"{name}_sum{{{text}}} {float(h[key][0])}"]
        for name, kind, samples in families:
            exposed = name + "_total" if kind == "counter" else name
            lines += [f"# HELP {exposed} {name} (stand-in)", f"# TYPE {exposed} {kind}"]
            for extra, value in samples:
                text = ",".join(f'{k}="{v}"' for k, v in {**labels, **extra}.items())
                lines.append(f"{exposed}{{{text}}} {float(value)}")
        return "\n".join(lines) + "\n"

    # -- serving
    def healthy(self):
        return (not self.unhealthy and self.health_after is not None
                and time.monotonic() - self.started >= self.health_after)

    def start(self, host="127.0.0.1", port=0):
        self.stopping.clear()
        self.server = _Server((host, port), Handler)
        self.server.engine = self
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    @property
    def url(self):
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def stop(self):
        self.stopping.set()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
        with self.lock:
            conns, self.connections = list(self.connections), set()
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # as uvicorn: a small SSE chunk goes out now, not after the client's delayed ACK

    def log_message(self, *a):
        pass

    @property
    def engine(self):
        return self.server.engine

    def setup(self):
        super().setup()
        with self.engine.lock:
            self.engine.connections.add(self.connection)

    def finish(self):
        with self.engine.lock:
            self.engine.connections.discard(self.connection)
        super().finish()

    def _send(self, code, body, ctype="application/json"):
        data = body.encode() if isinstance(body, str) else body
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, code, message):
        self._send(code, json.dumps({"error": {"message": message, "type": "BadRequestError", "code": code}}))

    def _refused(self):
        """Record the request; answer 401 (True) where vLLM's --api-key would."""
        auth = self.headers.get("Authorization")
        self.engine.requests_seen.append((self.command, self.path, auth))
        key = self.engine.b.api_key
        if key and self.path.startswith("/v1/") and auth != f"Bearer {key}":
            self._send(401, '{"error": "Unauthorized"}')
            return True
        return False

    def do_GET(self):
        if self._refused():
            return
        if self.path == "/health":
            healthy = self.engine.healthy()
            self._send(200 if healthy else 503, "" if healthy else '{"error": "engine starting"}')
        elif self.path == "/metrics" and self.engine.b.metrics == "http500":
            self._send(500, "Internal Server Error")
        elif self.path == "/metrics" and self.engine.b.metrics == "garbage":
            self._send(200, "<html>this { is not exposition\n", "text/plain")
        elif self.path == "/metrics":
            text = self.engine.metrics_text()
            if text is None:
                self._send(404, '{"detail": "Not Found"}')
            else:
                self._send(200, text, "text/plain; version=0.0.4; charset=utf-8")
        elif self.path == "/v1/models":
            self._send(200, json.dumps({"object": "list", "data": [{"id": self.engine.b.model, "object": "model"}]}))
        else:
            self._send(404, '{"error": "not found"}')

    def do_POST(self):
        length = int(self.headers.get("Content-Length", 0))
        raw = self.rfile.read(length)
        if self._refused():
            return
        if self.path != "/v1/chat/completions":
            self._send(404, '{"error": "not found"}')
            return
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            self._error(400, "request body is not JSON")
            return
        engine = self.engine
        engine.chat_bodies.append(body)
        prompt = _prompt_text(body.get("messages"))
        number, prompt_tokens, delay = engine.admit(prompt)
        try:
            if engine.b.hang:
                engine.stopping.wait()
                return
            if engine.b.fail_every and number % engine.b.fail_every == 0:
                echo = f": bad key {self.headers.get('Authorization')}" if engine.b.echo_auth else ""
                self._error(500, "stand-in failure, as asked" + echo)
            elif engine.b.no_mm and _has_image(body.get("messages")):
                self._error(400, "the chat template has no image support")
            elif int(body.get("n") or 1) > 1 and body.get("temperature", 1.0) < 1e-5:  # vLLM's greedy line
                self._error(400, f"n must be 1 when using greedy sampling, got {body['n']}.")  # vLLM 0.32's words
            elif body.get("tools") and body.get("tool_choice", "auto") != "auto":
                self._error(400, 'only tool_choice "auto" is supported by the glm47 tool parser')
            else:
                self._complete(body, prompt, prompt_tokens, delay)
        except ClientGone:
            pass
        finally:
            engine.leave()

    def _pieces(self, body, delay):
        """The output as (field, text) pieces, one per step: reasoning first, then content or a tool call."""
        b = self.engine.b
        tools = body.get("tools") or []
        count = 0
        for n in self.engine.steps(int(body.get("max_tokens") or 16), delay):
            words = [WORDS[(count + i) % len(WORDS)] for i in range(n)]
            text = "".join(" " + w for w in words)
            count += n
            if count - n < b.reasoning_tokens:
                yield n, "reasoning", text
            elif tools:
                yield n, "tool", text
            else:
                yield n, "content", text

    def _tool_call(self, body, prompt):
        fn = (body["tools"][0] or {}).get("function", {})
        args = _first_json_object(prompt)
        if self.engine.b.tool_fault == "args":
            args = {"unexpected": True}
        return fn.get("name", "tool"), json.dumps(args)

    def _complete(self, body, prompt, prompt_tokens, delay):
        b = self.engine.b
        stream = bool(body.get("stream"))
        include_usage = bool((body.get("stream_options") or {}).get("include_usage")) and not b.no_usage
        created = int(time.time())
        head = {"id": "chatcmpl-standin", "created": created, "model": b.model}

        want_logprobs = bool(body.get("logprobs"))
        sampled = [0]

        def logprobs(n, answer=0):
            """The logprobs block of n sampled tokens of one answer, as vLLM writes it."""
            out = []
            for _ in range(n):
                sampled[0] += 1
                bad = b.corrupt_every and sampled[0] % b.corrupt_every == 0 \
                    and b.corrupt_answer in (None, answer)
                out.append({"token": "x", "logprob": -113.0 if bad else b.logprob, "bytes": [120], "top_logprobs": []})
            return {"content": out}

        def chunk(delta, finish=None, n=0):
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
            if want_logprobs and n:
                choice["logprobs"] = logprobs(n)
            return {**head, "object": "chat.completion.chunk", "choices": [choice]}

        held = []
        emit = held.append if (stream and b.burst) else self._event

        if stream:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")  # as uvicorn streams
            self.end_headers()
            self._event(chunk({"role": "assistant", "content": ""}))
            if b.role_delay:
                time.sleep(b.role_delay)
        reasoning, content, tool_args_sent, completion = [], [], False, 0
        step_times, all_logprobs = [], []
        name, args = self._tool_call(body, prompt) if body.get("tools") else (None, None)
        for n, field, text in self._pieces(body, delay):
            completion += n
            step_times.append(time.monotonic())
            self.engine.record_tokens(n)
            if field == "reasoning":
                reasoning.append(text)
                delta = {b.reasoning_field: text}
                if b.reasoning_fault == "merge":
                    delta = {"content": ("<think>" if len(reasoning) == 1 else "") + text}
            elif field == "tool":
                if tool_args_sent:
                    continue
                tool_args_sent = True
                if b.tool_fault == "leak":
                    delta = {"content": f"<tool_call>{name}\n{args}</tool_call>"}
                    content.append(delta["content"])
                else:
                    delta = {"tool_calls": [{"index": 0, "id": "call_standin", "type": "function",
                                             "function": {"name": name, "arguments": args}}]}
            else:
                if b.fffd and not content:
                    text = "\ufffd" + text
                content.append(text)
                delta = {"content": text}
            if stream:
                if b.malformed:
                    self._raw("data: {\"choices\": [ this is not json\n\n")
                    self._raw("")
                    return
                emit(chunk(delta, n=n))
            elif want_logprobs:
                all_logprobs += logprobs(n)["content"]
        self.engine.record_request(step_times, completion)
        for doc in held:
            self._event(doc)
        finish = "tool_calls" if tool_args_sent and b.tool_fault != "leak" else "stop"
        if not stream:
            message = {"role": "assistant", "content": "".join(content) or None}
            if reasoning:
                if b.reasoning_fault == "merge":
                    message["content"] = "<think>" + "".join(reasoning) + "</think>" + (message["content"] or "")
                else:
                    message[b.reasoning_field] = "".join(reasoning)
            if tool_args_sent and b.tool_fault != "leak":
                message["tool_calls"] = [{"id": "call_standin", "type": "function",
                                          "function": {"name": name, "arguments": args}}]
            choices = []
            answers = max(1, int(body.get("n") or 1))  # "n" answers: the same text, each sampled anew
            for answer in range(min(answers, b.most_answers) if b.most_answers else answers):
                choice = {"index": answer, "message": message, "finish_reason": finish}
                if want_logprobs:
                    choice["logprobs"] = {"content": all_logprobs} if answer == 0 else logprobs(completion, answer)
                choices.append(choice)
            self._send(200, json.dumps({**head, "object": "chat.completion", "choices": choices,
                                        "usage": _usage(prompt_tokens, completion)}))
            return
        self._event(chunk({}, finish))
        if include_usage:
            self._event({**head, "object": "chat.completion.chunk", "choices": [],
                         "usage": _usage(prompt_tokens, completion)})
        self._raw("data: [DONE]\n\n")
        self._raw("")  # the last chunk

    def _event(self, doc):
        self._raw(f"data: {json.dumps(doc)}\n\n")

    def _raw(self, text):
        data = text.encode()
        try:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            raise ClientGone from None


def redacted(env):
    """The environment with secrets (names ending _KEY or _TOKEN) as a sha256 prefix: a test can still tell the
    right value arrived, and /tmp never holds the secret."""
    return {k: "sha256:" + hashlib.sha256(v.encode()).hexdigest()[:16] if k.endswith(("_KEY", "_TOKEN")) else v
            for k, v in env.items()}


def main():
    global HEALTH_DELAY
    record = os.environ.get("STANDIN_RECORD", "/tmp/standin-record.json")
    try:
        with open(record, "w") as f:
            json.dump({"argv": sys.argv[1:], "env": redacted(os.environ)}, f, indent=1, sort_keys=True)
    except OSError as exc:
        log(f"could not record argv to {record}: {exc}")
    mode = os.environ.get("STANDIN_HEALTH_DELAY", "2")
    log(f"stand-in engine starting; argv={sys.argv[1:]}")
    for delay, line in boot_script():
        time.sleep(float(delay))
        print(line, flush=True)
    die_with = for_this_rank("STANDIN_DIE_WITH", None) or die_on()
    if die_with:
        print(die_with, flush=True)
        sys.exit(1)
    if mode == "die":
        log("RuntimeError: stand-in told to die during boot")
        sys.exit(3)
    HEALTH_DELAY = None if mode == "never" else float(mode)
    if "--headless" in sys.argv:
        log("headless rank: no API server")
        die_after = os.environ.get("STANDIN_HEADLESS_DIE_AFTER")
        if die_after:
            time.sleep(float(die_after))
            log("RuntimeError: stand-in worker lost its peer and exits")
            sys.exit(4)
        while True:
            time.sleep(3600)
    port = int(arg("--port", "8000"))
    behaviour = dataclasses.replace(Behaviour.from_env(os.environ), model=arg("--served-model-name", "standin"),
                                    spec_tokens=spec_tokens())
    engine = Engine(behaviour)
    engine.health_after = HEALTH_DELAY
    engine.start(arg("--host", "0.0.0.0"), port)
    log(f"Starting API server on port {port}")
    engine.stopping.wait()


HEALTH_DELAY = None
if __name__ == "__main__":
    main()
