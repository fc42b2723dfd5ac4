"""`sparkstack verify` on a bad command line: one line, exit 2, no request sent, and a key given by mistake
where a variable NAME belongs is never echoed."""

import pytest
from inprocess_engine import serving

SECRET = "sk-live-7d1e0c55aa"

BAD = [
    ["ftp://127.0.0.1:8000"],
    ["http://"],
    ["127.0.0.1:8000"],
    ["http://127.0.0.1:99999"],
    ["http://user:pw@127.0.0.1:8000"],
    ["http://127.0.0.1:8000/?x=1"],
    ["{url}", "--timeout", "nan"],
    ["{url}", "--timeout", "0"],
    ["{url}", "--timeout", "-5"],
    ["{url}", "--model", ""],
    ["{url}", "--api-key-env", ""],
    ["{url}", "--api-key-env", SECRET],
    ["{url}", "--api-key", SECRET],
    [],
]


@pytest.mark.parametrize("args", BAD, ids=[" ".join(a)[:40] or "no-url" for a in BAD])
def test_bad_command_lines_are_one_line_and_send_nothing(run_inproc, args):
    with serving() as engine:
        proc = run_inproc("verify", *[a.replace("{url}", engine.url) for a in args], "--dry-run" if args else "--json")
        proc_real = run_inproc("verify", *[a.replace("{url}", engine.url) for a in args])
        assert engine.requests_seen == []
    for p in (proc, proc_real):
        assert p.returncode == 2, (p.stdout, p.stderr)
        lines = p.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("sparkstack: error: ") and p.stdout == ""
        assert "Traceback" not in p.stderr and SECRET not in p.stderr
