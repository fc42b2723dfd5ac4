"""A STAND-IN for the vLLM engine, for the two-host lab. It serves no model.

It takes the engine's argv as vLLM would, and:
- records its argv and environment as JSON to $STANDIN_RECORD (default /tmp/standin-record.json);
- prints log lines like the engine's, including the boot lines launch looks for;
- serves /health after $STANDIN_HEALTH_DELAY seconds, or never ("never"), or dies instead ("die");
- as a headless rank, dies after $STANDIN_HEADLESS_DIE_AFTER seconds when that is set;
- serves /metrics with vLLM's spec-decode counter names, and /v1/chat/completions (streaming too).
Only the Python standard library is used: it runs on any base with python3.
"""

import json
import os
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
STARTED = time.monotonic()
COUNTERS = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "per_pos": [0, 0, 0, 0]}
LOCK = threading.Lock()


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


def metrics_text():
    """The exposition prometheus_client writes for vLLM's counters: HELP/TYPE name the `_total` series."""
    n = spec_tokens()
    with LOCK:
        c = dict(COUNTERS, per_pos=list(COUNTERS["per_pos"]))
    series = [("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", [({}, c["drafts"])]),
              ("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", [({}, c["draft_tokens"])]),
              ("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", [({}, c["accepted"])]),
              ("vllm:spec_decode_num_accepted_tokens_per_pos", "Accepted tokens per draft position.",
               [({"position": str(i)}, c["per_pos"][i] if i < 4 else 0) for i in range(n)])]
    lines = []
    for name, help_text, samples in series:
        lines += [f"# HELP {name}_total {help_text}", f"# TYPE {name}_total counter"]
        for labels, value in samples:
            text = ",".join(f'{k}="{v}"' for k, v in {"model_name": "standin", **labels}.items())
            lines.append(f"{name}_total{{{text}}} {float(value)}")
    return "\n".join(lines) + "\n"


def record_step():
    # A deterministic acceptance profile: position i accepted on 1 draft in (i + 2).
    with LOCK:
        COUNTERS["drafts"] += 1
        COUNTERS["draft_tokens"] += spec_tokens()
        k = COUNTERS["drafts"]
        for i in range(4):
            if k % (i + 2) == 0:
                COUNTERS["per_pos"][i] += 1
                COUNTERS["accepted"] += 1


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def _send(self, code, body, ctype="application/json"):
        data = body.encode() if isinstance(body, str) else body
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            healthy = HEALTH_DELAY is not None and time.monotonic() - STARTED >= HEALTH_DELAY
            self._send(200 if healthy else 503, "" if healthy else '{"error": "engine starting"}')
        elif self.path == "/metrics":
            self._send(200, metrics_text(), "text/plain; version=0.0.4")
        elif self.path == "/v1/models":
            self._send(200, json.dumps({"object": "list", "data": [{"id": arg("--served-model-name", "standin"), "object": "model"}]}))
        else:
            self._send(404, '{"error": "not found"}')

    def do_POST(self):
        if self.path != "/v1/chat/completions":
            self._send(404, '{"error": "not found"}')
            return
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        words = ["The", " stand-in", " engine", " says", " hello", "."][: max(1, int(body.get("max_tokens", 6)))]
        model = arg("--served-model-name", "standin")
        for _ in words:
            record_step()
        if not body.get("stream"):
            self._send(200, json.dumps({
                "id": "chatcmpl-standin", "object": "chat.completion", "created": int(time.time()), "model": model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "".join(words)}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": len(words), "total_tokens": 3 + len(words)}}))
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for i, w in enumerate(words):
            chunk = {"id": "chatcmpl-standin", "object": "chat.completion.chunk", "created": int(time.time()),
                     "model": model, "choices": [{"index": 0, "delta": ({"role": "assistant"} if i == 0 else {}) | {"content": w},
                                                  "finish_reason": None}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
        done = {"id": "chatcmpl-standin", "object": "chat.completion.chunk", "model": model,
                "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
        self.wfile.write(f"data: {json.dumps(done)}\n\ndata: [DONE]\n\n".encode())
        self.wfile.flush()


def main():
    global HEALTH_DELAY
    record = os.environ.get("STANDIN_RECORD", "/tmp/standin-record.json")
    try:
        with open(record, "w") as f:
            json.dump({"argv": sys.argv[1:], "env": dict(os.environ)}, f, indent=1, sort_keys=True)
    except OSError as exc:
        log(f"could not record argv to {record}: {exc}")
    mode = os.environ.get("STANDIN_HEALTH_DELAY", "2")
    log(f"stand-in engine starting; argv={sys.argv[1:]}")
    for line in BOOT_LINES:
        log(line)
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
    server = ThreadingHTTPServer((arg("--host", "0.0.0.0"), port), Handler)
    log(f"Starting API server on port {port}")
    server.serve_forever()


HEALTH_DELAY = None
if __name__ == "__main__":
    main()
