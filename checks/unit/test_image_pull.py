"""`image pull` against Debian's real docker-registry (distribution 2.8), and against the registry stand-in for auth.

The fixture base (checks/imagefix.py, its last layer a 3 MiB plain tar so a pull can be cut inside it) is pushed to
the real registry with skopeo and pinned with `pin base`. Pulls go through a small proxy in front of the registry
(SPARKSTACK_REGISTRY_MIRROR), which logs what it was asked (the Range header) and how many body bytes it passed,
and on demand cuts the connection after N bytes of one blob or flips one byte of it: the faults the real registry
will not make. Expected digests and sizes come from the fixture's own bytes; the layout is judged by skopeo, umoci
and `image build --base`.
"""

import contextlib
import hashlib
import http.client
import json
import os
import re
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import imagefix as fx
from clirun import need, one_error_line
from registry_standin import Standin, fixture_repo

REF = "localhost:5000/sparkstack-test/base:pull"  # the name the pins carry; every request goes to a mirror
FILLER = 3 << 20
CUT_AT = 1_500_000  # more than one of the client's 1 MiB reads, less than the filler layer


class DockerRegistry:
    """docker-registry serving a tmp dir on 127.0.0.1, on a port the kernel picks (read back from its log)."""

    def __init__(self, state: Path) -> None:
        self.state = state

    def __enter__(self):
        self.state.mkdir(parents=True, exist_ok=True)
        config = self.state / "config.yml"
        config.write_text(f"version: 0.1\nlog:\n  level: info\nstorage:\n  filesystem:\n    rootdirectory: "
                          f"{self.state / 'data'}\nhttp:\n  addr: 127.0.0.1:0\n")
        self.log = self.state / "registry.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen([need("docker-registry"), "serve", str(config)], stdout=out,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 60  # a bound on a start that failed, never a verdict
        while True:
            m = re.search(r"listening on (127\.0\.0\.1:\d+)", self.log.read_text())
            if m:
                self.host = m.group(1)
                return self
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                raise AssertionError(f"docker-registry did not start: {self.log.read_text()[-800:]}")
            time.sleep(0.05)

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)

    @property
    def url(self) -> str:
        return f"http://{self.host}"


class Proxy:
    """Passes GETs to `upstream`, logging each request's path and Range and the body bytes sent per path.

    `cut[digest] = n`: the next answer for that blob stops after n body bytes and the connection closes.
    `flip.add(digest)`: every answer for that blob has its first body byte flipped."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.cut: dict[str, int] = {}
        self.flip: set[str] = set()
        self.refuse_range = False  # answer 416 to every Range (a registry that will not serve ranges)
        self.misrange = False  # answer every Range with a 206 of the whole blob, its Content-Range saying so
        self.extra: dict[str, bytes] = {}  # digest -> bytes added after the blob's own (a body past its size)
        self.stall: dict[str, int] = {}  # digest -> n: send n body bytes, then hold until `release` is set
        self.stalled, self.release = threading.Event(), threading.Event()
        self.log: list[dict] = []
        self.lock = threading.Lock()

    def __enter__(self):
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                entry = {"path": self.path, "range": self.headers.get("Range"), "sent": 0}
                with proxy.lock:
                    proxy.log.append(entry)
                if proxy.refuse_range and entry["range"]:
                    self.send_response(416)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                conn = http.client.HTTPConnection(proxy.upstream, timeout=30)
                keep = {k: v for k, v in self.headers.items() if k.lower() in ("accept", "range", "authorization",
                                                                                "user-agent")}
                conn.request("GET", self.path, headers=keep)
                resp = conn.getresponse()
                body = resp.read()
                conn.close()
                digest = self.path.rsplit("/", 1)[-1]
                with proxy.lock:
                    cut = proxy.cut.pop(digest, None) if "/blobs/" in self.path else None
                if digest in proxy.flip and body:
                    body = bytes([body[0] ^ 0xFF]) + body[1:]
                headers = [(k, v) for k, v in resp.getheaders()
                           if k.lower() not in ("connection", "transfer-encoding", "date", "content-length")]
                if proxy.misrange and entry["range"] and resp.status == 206:
                    conn = http.client.HTTPConnection(proxy.upstream, timeout=30)
                    conn.request("GET", self.path, headers={k: v for k, v in keep.items() if k.lower() != "range"})
                    body = conn.getresponse().read()
                    conn.close()
                    headers = [(k, v) for k, v in headers if k.lower() != "content-range"]
                    headers.append(("Content-Range", f"bytes 0-{len(body) - 1}/{len(body)}"))
                body += proxy.extra.get(digest, b"") if "/blobs/" in self.path else b""
                self.send_response(resp.status)
                for k, v in headers:
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                if cut is not None:
                    self.send_header("Connection", "close")
                    self.close_connection = True
                self.end_headers()
                with proxy.lock:
                    stall = proxy.stall.pop(digest, None) if "/blobs/" in self.path else None
                if stall is not None:
                    try:
                        self.wfile.write(body[:stall])
                        self.wfile.flush()
                    except (BrokenPipeError, ConnectionResetError):
                        return
                    entry["sent"] = stall
                    proxy.stalled.set()
                    proxy.release.wait(120)
                    return
                out = body if cut is None else body[:cut]
                try:
                    self.wfile.write(out)
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    return
                entry["sent"] = len(out)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def blob_requests(self, digest: str) -> list[dict]:
        with self.lock:
            return [e for e in self.log if e["path"].endswith(f"/blobs/{digest}")]

    def clear(self) -> None:
        with self.lock:
            self.log.clear()


@pytest.fixture(scope="module")
def pushed(tmp_path_factory):
    """The fixture base pushed to a real docker-registry and pinned from it; its digests and sizes from its bytes."""
    skopeo = need("skopeo")
    tmp = tmp_path_factory.mktemp("pull")
    layout = tmp / "fixture"
    facts = fx.write_base(layout, layers=fx.default_layers(filler_bytes=FILLER))
    sizes = {"sha256:" + p.name: p.stat().st_size for p in (layout / "blobs/sha256").iterdir()}
    with DockerRegistry(tmp / "registry") as registry:
        subprocess.run([skopeo, "copy", "--quiet", "--preserve-digests", "--dest-tls-verify=false",
                        f"oci:{layout}:base", f"docker://{registry.host}/sparkstack-test/base:pull"],
                       check=True, capture_output=True, timeout=300)
        pins = tmp / "pins.json"
        from clirun import sparkstack_cmd

        subprocess.run(sparkstack_cmd() + ["pin", "base", REF, "--pins", str(pins)], check=True, capture_output=True,
                       env={**os.environ, "SPARKSTACK_REGISTRY_MIRROR": registry.url}, timeout=120)
        yield {"registry": registry, "pins": pins, "facts": facts, "sizes": sizes, "layout": layout}


@pytest.fixture
def proxy(pushed):
    with Proxy(pushed["registry"].host) as p:
        yield p


def pull(run_cli, pushed, proxy, out, *extra, check=None):
    return run_cli("image", "pull", "--out", out, "--pins", pushed["pins"], *extra,
                   env={"SPARKSTACK_REGISTRY_MIRROR": proxy.url}, check=check)


def all_digests(facts) -> list[str]:
    return [facts["manifest"], facts["config"], *facts["layers"]]


def looks_complete(out: Path) -> bool:
    return (out / "index.json").exists() or (out / "oci-layout").exists()


def test_a_full_pull_is_a_layout_skopeo_umoci_and_image_build_accept(pushed, proxy, run_cli, tmp_path, monkeypatch):
    out = tmp_path / "base"
    facts, sizes = pushed["facts"], pushed["sizes"]
    doc = json.loads(pull(run_cli, pushed, proxy, out, "--json", check=0).stdout)
    assert doc["manifest"] == facts["manifest"]
    assert doc["result"]["bytes_fetched"] == sum(sizes[d] for d in all_digests(facts))
    for d in all_digests(facts):
        blob = out / "blobs/sha256" / d.split(":")[1]
        assert "sha256:" + hashlib.sha256(blob.read_bytes()).hexdigest() == d
    assert not list(out.glob("blobs/sha256/*.partial"))
    index = json.loads((out / "index.json").read_text())
    assert [m["digest"] for m in index["manifests"]] == [facts["manifest"]]
    assert index["manifests"][0]["platform"] == {"os": "linux", "architecture": "arm64"}

    skopeo, umoci = need("skopeo"), need("umoci")
    inspected = subprocess.run([skopeo, "inspect", f"oci:{out}"], capture_output=True, text=True, timeout=120)
    assert inspected.returncode == 0, inspected.stderr
    assert json.loads(inspected.stdout)["Digest"] == facts["manifest"]
    copied = subprocess.run([skopeo, "copy", "--quiet", f"oci:{out}", f"dir:{tmp_path / 'dir'}"],
                            capture_output=True, text=True, timeout=120)  # skopeo checks every blob's digest
    assert copied.returncode == 0, copied.stderr
    tag = index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"]
    unpacked = subprocess.run([umoci, "unpack", "--rootless", "--image", f"{out}:{tag}", str(tmp_path / "bundle")],
                              capture_output=True, text=True, timeout=300)  # checks digests and diff_ids
    assert unpacked.returncode == 0, unpacked.stderr
    assert (tmp_path / "bundle/rootfs/opt/filler.bin").stat().st_size == FILLER

    monkeypatch.setenv("SPARKSTACK_CACHE_DIR", str(tmp_path / "cache"))
    src = fx.write_overlay_source(tmp_path / "src")
    overlay = fx.write_overlay(tmp_path / "overlay", pinned_from=src / "overlay-dflash2")
    built = run_cli("image", "build", "--base", out, "--overlay", overlay, "--overlay-src", src,
                    "--out", tmp_path / "image", "--json", check=0)
    assert json.loads(built.stdout)["plan"]["base_manifest"] == facts["manifest"]

    # A second pull asks the registry nothing and rewrites nothing.
    before = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in out.rglob("*") if p.is_file()}
    proxy.clear()
    again = pull(run_cli, pushed, proxy, out, check=0)
    assert again.stdout.startswith("up to date: ")
    assert proxy.log == []
    assert {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in out.rglob("*") if p.is_file()} == before


def test_dry_run_says_what_is_missing_in_bytes_and_fetches_nothing(pushed, proxy, run_cli, tmp_path):
    facts, sizes = pushed["facts"], pushed["sizes"]
    out = tmp_path / "base"
    doc = json.loads(pull(run_cli, pushed, proxy, out, "--dry-run", "--json", check=0).stdout)
    assert doc["missing_bytes"] == sum(sizes[d] for d in all_digests(facts))
    assert [b["digest"] for b in doc["blobs"]] == all_digests(facts)
    assert proxy.log == [] and not out.exists()


def test_a_pull_cut_mid_blob_resumes_with_a_range_and_fetches_only_the_rest(pushed, proxy, run_cli, tmp_path):
    facts, sizes = pushed["facts"], pushed["sizes"]
    big = facts["layers"][-1]
    assert sizes[big] > CUT_AT
    out = tmp_path / "base"
    proxy.cut[big] = CUT_AT
    cut = pull(run_cli, pushed, proxy, out)
    assert cut.returncode == 1
    line = one_error_line(cut)
    assert big in line and "pull again to fetch the rest" in line
    assert not looks_complete(out)
    partial = out / "blobs/sha256" / (big.split(":")[1] + ".partial")
    held = partial.stat().st_size
    assert 0 < held <= CUT_AT
    assert not (out / "blobs/sha256" / big.split(":")[1]).exists()
    finished = [d for d in all_digests(facts) if (out / "blobs/sha256" / d.split(":")[1]).exists()]

    proxy.clear()
    doc = json.loads(pull(run_cli, pushed, proxy, out, "--json", check=0).stdout)
    again = proxy.blob_requests(big)
    assert [(e["range"], e["sent"]) for e in again] == [(f"bytes={held}-", sizes[big] - held)]
    assert doc["result"]["resumed"] == [big]
    for d in finished:  # what the first run finished is not asked for again
        assert proxy.blob_requests(d) == [] and d not in doc["result"]["fetched"]
    assert doc["result"]["bytes_fetched"] == sum(sizes[d] for d in all_digests(facts) if d not in finished) - held
    blob = out / "blobs/sha256" / big.split(":")[1]
    assert "sha256:" + hashlib.sha256(blob.read_bytes()).hexdigest() == big and not partial.exists()
    copied = subprocess.run([need("skopeo"), "copy", "--quiet", f"oci:{out}", f"dir:{tmp_path / 'dir'}"],
                            capture_output=True, text=True, timeout=120)
    assert copied.returncode == 0, copied.stderr


def test_a_corrupted_blob_is_refused_by_digest_and_nothing_looks_complete(pushed, proxy, run_cli, tmp_path):
    facts = pushed["facts"]
    bad = facts["layers"][0]
    proxy.flip.add(bad)
    out = tmp_path / "base"
    proc = pull(run_cli, pushed, proxy, out)
    assert proc.returncode == 1
    line = one_error_line(proc)
    assert bad in line and "refusing" in line
    assert not looks_complete(out)
    hexd = bad.split(":")[1]
    assert not (out / "blobs/sha256" / hexd).exists() and not (out / "blobs/sha256" / (hexd + ".partial")).exists()
    proxy.flip.clear()
    pull(run_cli, pushed, proxy, out, check=0)
    assert (out / "index.json").exists()


def test_auth_token_flow_and_a_registry_that_ignores_range(tmp_path, run_cli):
    """The stand-in asks for a bearer token and redirects blobs to a CDN that refuses Authorization and answers
    a Range request with 200: the partial is dropped and the whole blob fetched again."""
    repos, served = fixture_repo(tmp_path / "fixture")
    with Standin(repos) as standin:
        env = {"SPARKSTACK_REGISTRY_MIRROR": standin.url}
        pins = tmp_path / "pins.json"
        run_cli("pin", "base", f"ghcr.io/{served.repo}:{served.tag}", "--pins", pins, env=env, check=0)
        arm = served.platforms["linux/arm64"]
        layout = served.layouts["linux/arm64"]
        layer = arm["layers"][0]
        data = (layout / "blobs/sha256" / layer.split(":")[1]).read_bytes()
        out = tmp_path / "base"
        (out / "blobs/sha256").mkdir(parents=True)
        # A killed run's partial, in a dir a pull made (its marker): wrong bytes, so only a full fetch can pass.
        (out / ".sparkstack").mkdir()
        (out / ".sparkstack/output.json").write_text(json.dumps({"written_by": "sparkstack image pull"}))
        (out / "blobs/sha256" / (layer.split(":")[1] + ".partial")).write_bytes(b"\0" * (len(data) // 2))
        doc = json.loads(run_cli("image", "pull", "--out", out, "--pins", pins, "--json", env=env, check=0).stdout)
        assert doc["result"]["resumed"] == []
        cdn = [r for r in standin.requests("cdn") if layer in r["path"]]
        assert [r["headers"].get("range") for r in cdn] == [f"bytes={len(data) // 2}-"]
        assert all("authorization" not in r["headers"] for r in standin.requests("cdn"))
        assert standin.tokens  # the token flow ran
        assert (out / "blobs/sha256" / layer.split(":")[1]).read_bytes() == data
        verified = run_cli("image", "verify", out, check=0)
        assert arm["config"] in verified.stdout


def test_the_progress_bar_counts_the_missing_bytes(pushed, proxy, tmp_path, monkeypatch):
    """The command's bar (bytes, rate and time left on a terminal: terminal.progress) gets the bytes still
    missing as its total and every byte fetched as an advance."""
    from sparkstack.command import View
    from sparkstack.oci.command import PULL, PullRequest

    class Recording(View):
        def __init__(self):
            super().__init__()
            self.bars, self.said = [], []

        def say(self, line):
            self.said.append(line)

        @contextlib.contextmanager
        def progress(self, label, total, enabled=True):
            bar = {"label": label, "total": total, "advanced": 0}
            self.bars.append(bar)
            yield lambda n: bar.__setitem__("advanced", bar["advanced"] + n)

    monkeypatch.setenv("SPARKSTACK_REGISTRY_MIRROR", proxy.url)
    facts, sizes = pushed["facts"], pushed["sizes"]
    view = Recording()
    plan = PULL.plan(PullRequest(out=tmp_path / "base", pins=pushed["pins"]), os.environ)
    PULL.apply(plan, view)
    want = sum(sizes[d] for d in all_digests(facts))
    assert view.bars == [{"label": "pulling linux/arm64 base", "total": want, "advanced": want}]
    assert sum(e["sent"] for e in proxy.log) == want


def test_a_killed_pull_resumes_from_what_it_had_written(pushed, proxy, tmp_path):
    """kill -9 in the middle of a blob: the next pull keeps the finished blobs and asks for the partial's rest."""
    from clirun import sparkstack_cmd

    facts, sizes = pushed["facts"], pushed["sizes"]
    big = facts["layers"][-1]
    out = tmp_path / "base"
    proxy.stall[big] = CUT_AT
    env = {**os.environ, "SPARKSTACK_REGISTRY_MIRROR": proxy.url}
    proc = subprocess.Popen(sparkstack_cmd() + ["image", "pull", "--out", str(out), "--pins", str(pushed["pins"])],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert proxy.stalled.wait(120), "the pull never reached the big blob"
        partial = out / "blobs/sha256" / (big.split(":")[1] + ".partial")
        deadline = time.monotonic() + 120  # a bound on the wait for the first chunk to land, not a verdict
        while not (partial.exists() and partial.stat().st_size > 0) and time.monotonic() < deadline:
            time.sleep(0.02)
        proc.kill()
        proc.wait(30)
    finally:
        proxy.release.set()
    assert not looks_complete(out)
    held = partial.stat().st_size
    assert 0 < held <= CUT_AT
    proxy.clear()
    again = subprocess.run(sparkstack_cmd() + ["image", "pull", "--out", str(out), "--pins", str(pushed["pins"]),
                                               "--json"], env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert [(e["range"], e["sent"]) for e in proxy.blob_requests(big)] == [(f"bytes={held}-", sizes[big] - held)]
    assert all(proxy.blob_requests(d) == [] for d in [facts["config"], *facts["layers"][:-1]])  # finished before
    blob = out / "blobs/sha256" / big.split(":")[1]
    assert "sha256:" + hashlib.sha256(blob.read_bytes()).hexdigest() == big and (out / "index.json").exists()


def test_a_registry_that_refuses_the_range_sends_the_whole_blob_again(pushed, proxy, run_cli, tmp_path):
    facts, sizes = pushed["facts"], pushed["sizes"]
    big = facts["layers"][-1]
    out = tmp_path / "base"
    proxy.cut[big] = CUT_AT
    assert pull(run_cli, pushed, proxy, out).returncode == 1
    held = (out / "blobs/sha256" / (big.split(":")[1] + ".partial")).stat().st_size
    assert held > 0
    proxy.clear()
    proxy.refuse_range = True
    doc = json.loads(pull(run_cli, pushed, proxy, out, "--json", check=0).stdout)
    assert [(e["range"], e["sent"]) for e in proxy.blob_requests(big)] == [(f"bytes={held}-", 0), (None, sizes[big])]
    assert doc["result"]["resumed"] == [] and doc["result"]["fetched"] == [big]
    blob = out / "blobs/sha256" / big.split(":")[1]
    assert "sha256:" + hashlib.sha256(blob.read_bytes()).hexdigest() == big


def test_a_partial_of_wrong_bytes_is_dropped_and_the_blob_fetched_once_from_byte_0(pushed, proxy, run_cli, tmp_path):
    """A partial a power cut left unsynced (zeros), or one another tool wrote: the resumed blob fails its hash, and
    the pull, not the honest registry, is at fault. It drops the partial and fetches the blob whole, once."""
    facts, sizes = pushed["facts"], pushed["sizes"]
    big = facts["layers"][-1]
    out = tmp_path / "base"
    partial = out / "blobs/sha256" / (big.split(":")[1] + ".partial")
    proxy.cut[big] = CUT_AT
    assert pull(run_cli, pushed, proxy, out).returncode == 1
    held = partial.stat().st_size
    partial.write_bytes(bytes(held))  # its length kept, its bytes lost
    proxy.clear()
    doc = json.loads(pull(run_cli, pushed, proxy, out, "--json", check=0).stdout)
    assert [(e["range"], e["sent"]) for e in proxy.blob_requests(big)] == [(f"bytes={held}-", sizes[big] - held),
                                                                          (None, sizes[big])]
    assert doc["result"]["resumed"] == [] and big in doc["result"]["fetched"]
    blob = out / "blobs/sha256" / big.split(":")[1]
    assert "sha256:" + hashlib.sha256(blob.read_bytes()).hexdigest() == big and (out / "index.json").exists()


def test_a_206_for_another_range_than_asked_is_met_by_asking_for_the_whole_blob(pushed, proxy, run_cli, tmp_path):
    facts, sizes = pushed["facts"], pushed["sizes"]
    big = facts["layers"][-1]
    out = tmp_path / "base"
    proxy.cut[big] = CUT_AT
    assert pull(run_cli, pushed, proxy, out).returncode == 1
    held = (out / "blobs/sha256" / (big.split(":")[1] + ".partial")).stat().st_size
    proxy.clear()
    proxy.misrange = True
    doc = json.loads(pull(run_cli, pushed, proxy, out, "--json", check=0).stdout)
    assert [e["range"] for e in proxy.blob_requests(big)] == [f"bytes={held}-", None]
    assert doc["result"]["resumed"] == []
    blob = out / "blobs/sha256" / big.split(":")[1]
    assert "sha256:" + hashlib.sha256(blob.read_bytes()).hexdigest() == big


def test_a_body_past_the_pinned_size_keeps_no_partial_even_after_a_resume(pushed, proxy, run_cli, tmp_path):
    """A registry that sends more than the pinned size: nothing of it is kept to resume onto, and a resumed blob
    that runs past its size is fetched once from byte 0 before the registry is blamed."""
    facts, sizes = pushed["facts"], pushed["sizes"]
    big = facts["layers"][-1]
    out = tmp_path / "base"
    partial = out / "blobs/sha256" / (big.split(":")[1] + ".partial")
    proxy.cut[big] = CUT_AT
    assert pull(run_cli, pushed, proxy, out).returncode == 1
    held = partial.stat().st_size
    assert held > 0
    proxy.clear()
    proxy.extra[big] = b"not the blob"
    proc = pull(run_cli, pushed, proxy, out)
    assert proc.returncode == 1
    line = one_error_line(proc)
    assert big in line and "pinned size" in line and "from byte 0" in line and "pull again" not in line, line
    assert [e["range"] for e in proxy.blob_requests(big)] == [f"bytes={held}-", None]
    assert not partial.exists() and not looks_complete(out)
    proxy.clear()
    proc = pull(run_cli, pushed, proxy, out)  # from nothing now: one request, refused, nothing kept
    assert proc.returncode == 1 and "pinned size" in one_error_line(proc)
    assert [e["range"] for e in proxy.blob_requests(big)] == [None] and not partial.exists()


def test_a_registry_on_this_machine_is_pinned_and_pulled_by_its_own_name_over_plain_http(pushed, run_cli, tmp_path):
    """A loopback registry (docker's own default insecure range) speaks http: `pin base 127.0.0.1:PORT/...` with no
    mirror set, then a pull of what it pinned."""
    registry, facts = pushed["registry"], pushed["facts"]
    pins = tmp_path / "pins.json"
    ref = f"{registry.host}/sparkstack-test/base:pull"
    run_cli("pin", "base", ref, "--pins", pins, env={"SPARKSTACK_REGISTRY_MIRROR": ""}, check=0)
    assert json.loads(pins.read_text())["reference"] == ref
    out = tmp_path / "base"
    run_cli("image", "pull", "--out", out, "--pins", pins, env={"SPARKSTACK_REGISTRY_MIRROR": ""}, check=0)
    index = json.loads((out / "index.json").read_text())
    assert index["manifests"][0]["digest"] == facts["manifest"]
