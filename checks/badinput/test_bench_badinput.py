"""`bench` against failing servers and with bad command lines: one clear line each, never a traceback."""

import json
import threading
import time

import pytest
from clirun import one_error_line
from inprocess_engine import serving


BLOCK = ["--concurrency", "1", "--rounds", "1", "--category", "code"]


@pytest.mark.parametrize("fields,args,says", [
    ({"malformed": True}, [], "a stream event is not a chat chunk"),
    ({"fail_every": 1}, [], "HTTP 500: stand-in failure, as asked"),
    ({"hang": True}, ["--timeout", "1"], "no answer in 1 s"),
])
def test_a_failing_server_is_one_line(run_inproc, fields, args, says):
    with serving(**fields) as engine:
        proc = run_inproc("bench", engine.url, *BLOCK, *args)
    assert proc.returncode == 1
    line = one_error_line(proc, code=None, notes_before=True)
    assert proc.stderr.strip() == line and "c=1 code: every request of round 1 failed" in line and says in line


def test_some_failed_requests_are_counted_and_fail_the_run(run_inproc):
    # every 2nd request answers 500: at concurrency 2, one of each round's two
    with serving(fail_every=2, cycles=1) as engine:
        proc = run_inproc("bench", engine.url, "--json", "--concurrency", "2", "--rounds", "2", "--category", "code")
    assert proc.returncode == 1
    (cell,) = json.loads(proc.stdout)["cells"]
    assert cell["errors"] == 2
    assert cell["drafts"] == 2 * 4  # the two that succeeded, one pass of the default pattern each
    assert "2 of 4 requests failed (first, in c=2 code: chat: HTTP 500" in one_error_line(proc, code=None, notes_before=True)


def test_a_dead_engine_is_one_line(run_inproc):
    with serving() as engine:
        url = engine.url
    proc = run_inproc("bench", url, *BLOCK)
    assert proc.returncode == 1
    assert "/health: " in one_error_line(proc, code=None, notes_before=True) and "not serving" in proc.stderr


def test_a_server_without_metrics_says_so(run_inproc):
    with serving(metrics="none") as engine:
        proc = run_inproc("bench", engine.url, *BLOCK)
    assert proc.returncode == 1
    assert "sparkstack: warning: " in proc.stderr and "/metrics: not found (404)" in proc.stderr
    assert "no_spec_metrics" in one_error_line(proc, code=None, notes_before=True)


def test_garbage_on_metrics_is_one_line(run_inproc):
    with serving() as engine:
        engine.metrics_text = lambda: "this is { not prometheus\n"
        proc = run_inproc("bench", engine.url, *BLOCK)
    assert proc.returncode == 1 and "/metrics is not Prometheus text exposition" in one_error_line(proc, code=None, notes_before=True)


@pytest.mark.parametrize("args,says", [
    (["--concurrency", "0"], "--concurrency"),
    (["--concurrency", "1,x"], "--concurrency"),
    (["--concurrency", ""], "--concurrency"),
    (["--rounds", "0"], "--rounds"),
    (["--max-tokens", "-1"], "--max-tokens"),
    (["--temperature", "nan"], "--temperature"),
    (["--top-p", "0"], "--top-p"),
    (["--top-p", "1.5"], "--top-p"),
    (["--category", "poetry"], "unknown category 'poetry'"),
    (["--plot", "/nonexistent-dir/x.png"], "no such directory"),
    (["--timeout", "inf"], "--timeout"),
])
def test_bad_options_are_usage_errors_and_send_nothing(run_inproc, args, says):
    with serving() as engine:
        proc = run_inproc("bench", engine.url, *args)
        assert engine.c["requests"] == 0
    assert proc.returncode == 2 and says in one_error_line(proc, code=None, notes_before=True)


@pytest.mark.parametrize("url", ["ftp://127.0.0.1/", "127.0.0.1:8000", "http://127.0.0.1:99999", "http://h/?q=1"])
def test_bad_urls_are_usage_errors(run_inproc, url):
    proc = run_inproc("bench", url, "--dry-run")
    assert proc.returncode == 2 and "URL" in one_error_line(proc, code=None, notes_before=True)


def test_the_plot_path_is_checked_before_the_run(run_inproc, tmp_path):
    with serving() as engine:
        proc = run_inproc("bench", engine.url, *BLOCK, "--plot", tmp_path)
        assert engine.c["requests"] == 0
    assert proc.returncode == 2 and "is a directory" in one_error_line(proc, code=None, notes_before=True)


def test_the_plot_never_replaces_a_file_bench_did_not_write(run_inproc, tmp_path):
    theirs = tmp_path / "holiday.png"
    theirs.write_bytes(b"\x89PNG\r\n\x1a\n" + b"someone's picture")
    with serving() as engine:
        proc = run_inproc("bench", engine.url, *BLOCK, "--plot", theirs)
        assert engine.c["requests"] == 0
    assert proc.returncode == 1 and "refusing to replace it" in one_error_line(proc, code=None, notes_before=True)
    assert theirs.read_bytes().endswith(b"someone's picture")


def test_markup_and_mathtext_in_names_are_text(run_inproc, tmp_path):
    """The model name is the server's and compare's files are anyone's: rich markup or a $ in them is text."""
    name = "[bold]m[/x] $\\frac$"
    with serving(model=name, cycles=1) as engine:
        proc = run_inproc("bench", engine.url, *BLOCK, "--json", "--plot", tmp_path / "p.png")
        human = run_inproc("bench", engine.url, *BLOCK)
    assert proc.returncode == 0 and human.returncode == 0, proc.stderr + human.stderr
    assert name in human.stdout
    doc = json.loads(proc.stdout)
    doc["cells"][0]["category"] = "[/oops]"
    report = tmp_path / "[odd].json"
    report.write_text(json.dumps(doc))
    cmp = run_inproc("compare", report, report)
    assert cmp.returncode == 0 and "[/oops]" in cmp.stdout and "[odd].json" in cmp.stdout, cmp.stderr


def test_a_restarted_server_stops_the_bench(run_inproc):
    """Counters that go back during a block (the engine restarted) make its deltas meaningless."""
    with serving(counters=(("drafts", 1000), ("accepted", 1000)), step_delay=0.05) as engine:
        def restart():
            while engine.c["requests"] == 0:
                time.sleep(0.005)
            with engine.lock:
                engine.c.update(drafts=0, accepted=0)

        watcher = threading.Thread(target=restart, daemon=True)
        watcher.start()
        proc = run_inproc("bench", engine.url, *BLOCK)
        watcher.join(5)
    assert proc.returncode == 1
    assert "c=1 code: the server's counters went back during round 1" in one_error_line(proc, code=None, notes_before=True)


@pytest.mark.parametrize("sig,code", [("SIGINT", 130), ("SIGTERM", 143), ("SIGHUP", 129)])
def test_ctrl_c_ends_the_bench_at_once_while_streams_are_open(tmp_path, sig, code):
    """Streams that never answer must not hold Ctrl-C back for --timeout (an hour here); nor `kill`, nor a hangup."""
    import signal
    import subprocess

    from clirun import sparkstack_cmd, start
    from inprocess_engine import wait_for

    with serving(hang=True) as engine:
        proc = start(sparkstack_cmd() + ["bench", engine.url, "--timeout", "3600", "--concurrency", "2",
                                         "--rounds", "1", "--category", "code"],
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            wait_for("both streams sent", lambda: engine.c["requests"] >= 2)
            proc.send_signal(getattr(signal, sig))
            _, err = proc.communicate(timeout=60)  # a bound on the test, far below the --timeout
        finally:
            proc.kill()
    assert proc.returncode == code, err
    assert "Traceback" not in err and "interrupted" in err


KEY = "sk-SECRET-123"


def test_a_key_the_server_echoes_is_masked(run_inproc, monkeypatch):
    """A careless server puts what it was sent into its error message; bench's lines must not carry it on."""
    from inprocess_engine import standin

    plain = standin.Handler._error
    monkeypatch.setattr(standin.Handler, "_error", lambda self, code, message: plain(
        self, code, f"bad key {self.headers.get('Authorization')}"))
    with serving(fail_every=2, cycles=1) as engine:
        proc = run_inproc("bench", engine.url, "--concurrency", "2", "--rounds", "1", "--category", "code",
                       env={"VLLM_API_KEY": KEY})
    assert proc.returncode == 1
    assert KEY not in proc.stdout + proc.stderr
    assert "HTTP 500: bad key Bearer ***" in one_error_line(proc, code=None, notes_before=True)


def test_a_server_failing_mid_bench_keeps_the_finished_cells(run_inproc):
    # concurrency 1, one round a block: request 1 is block 1's, request 2 (answered 500) block 2's
    with serving(fail_every=2, cycles=1) as engine:
        proc = run_inproc("bench", engine.url, "--json", "--concurrency", "1", "--rounds", "1", "--category",
                       "code,json")
    assert proc.returncode == 1
    doc = json.loads(proc.stdout)
    assert [(c["concurrency"], c["category"], c["errors"]) for c in doc["cells"]] == [(1, "code", 0)]
    line = one_error_line(proc, code=None, notes_before=True)
    assert "stopped after 1 cells: c=1 json: every request of round 1 failed" in line and "HTTP 500" in line


def test_server_text_cannot_drive_the_terminal(run_inproc):
    name = "evil\x1b[2J\x1b]0;owned\x07model"
    with serving(model=name, cycles=1) as engine:
        proc = run_inproc("bench", engine.url, *BLOCK)
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout and "\x07" not in proc.stdout
    assert "evil\\x1b[2J\\x1b]0;owned\\x07model" in proc.stdout.replace("\n", "")


def test_an_unwritable_plot_directory_is_refused_before_the_run(run_inproc):
    with serving() as engine:
        proc = run_inproc("bench", engine.url, *BLOCK, "--plot", "/proc/x.png")
        assert engine.c["requests"] == 0
    assert proc.returncode == 2 and "--plot /proc/x.png: cannot write in /proc" in one_error_line(proc, code=None, notes_before=True)


def test_a_plot_that_fails_at_the_end_still_prints_the_figures_first(run_inproc, tmp_path):
    where = tmp_path / "gone"
    where.mkdir()
    with serving(cycles=1, step_delay=0.05) as engine:
        def remove_the_directory():
            while engine.c["requests"] == 0:
                time.sleep(0.005)
            where.rmdir()

        remover = threading.Thread(target=remove_the_directory, daemon=True)
        remover.start()
        proc = run_inproc("bench", engine.url, *BLOCK, "--json", "--plot", where / "p.png")
        remover.join(5)
    assert proc.returncode == 1
    assert [c["category"] for c in json.loads(proc.stdout)["cells"]] == ["code"]
    assert "No such file or directory" in one_error_line(proc, code=None, notes_before=True)


def test_a_plot_the_user_owns_is_refused_in_plot_words(run_inproc, tmp_path):
    theirs = tmp_path / "holiday.png"
    theirs.write_bytes(b"not a png")
    proc = run_inproc("bench", "http://127.0.0.1:9", "--dry-run", "--plot", theirs)
    line = one_error_line(proc, code=None, notes_before=True)
    assert "is not a plot sparkstack wrote" in line and "choose another --plot" in line
    assert "archive" not in line and "--out" not in line


@pytest.mark.parametrize("args,says", [
    (["--model", ""], "--model"),
    (["--model", "  "], "--model"),
    (["--api-key-env", "sk-abc def"], "--api-key-env"),
    (["--concurrency", "\u00b2"], "--concurrency"),
    (["--concurrency", "1,\u0663"], "--concurrency"),
    (["--concurrency", "9" * 5000], "--concurrency"),
])
def test_bad_options_are_refused_even_in_a_dry_run(run_inproc, args, says):
    proc = run_inproc("bench", "http://127.0.0.1:9", "--dry-run", *args)
    assert proc.returncode == 2 and says in one_error_line(proc, code=None, notes_before=True)
