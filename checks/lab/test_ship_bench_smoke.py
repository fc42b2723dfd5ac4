"""The ship benchmark runs end to end at a tiny size, in a lab of its own. Sizes and bytes are asserted, never times."""

import json
import subprocess
import sys
from pathlib import Path

from conftest import require

BENCH = Path(__file__).parents[1] / "bench" / "ship_bench.py"
MIB = 1 << 20


def _netns() -> set[str]:
    return {l.split()[0] for l in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.splitlines()
            if l.strip()}


def test_ship_bench_runs_and_counts_the_wire(tmp_path):
    require("ip", "dockerd", "sshd", "rsync")
    before = _netns()
    proc = subprocess.Popen([sys.executable, str(BENCH), "--base-mib", "8", "--overlay-mib", "2", "--weights-mib", "16",
                             "--shard-mib", "8", "--workdir", str(tmp_path), "--json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr
    r = json.loads(stdout)
    img, wt = r["image"], r["weights"]
    assert img["b_ship_first"]["bytes_sent"] == img["image_bytes"]
    assert img["c_ship_after_change"]["bytes_sent"] == sum(img["changed_blobs"].values())
    assert img["c_noop_ship"]["bytes_sent"] == 0
    # At this size the 1% allowance is smaller than a few ssh handshakes; what ship adds beyond the raw stream
    # and a no-op ship must still be a fixed few connections' worth, not a function of the image.
    extra = img["c_ship_after_change"]["wire_bytes"] - img["c_raw_changed_blobs"]["wire_bytes"] - img["c_noop_ship"]["wire_bytes"]
    assert extra < 128 << 10, img
    for s in (1, 2, 4):
        assert wt[f"ship_streams_{s}"]["bytes_sent"] == wt["bytes"]
        assert wt[f"ship_streams_{s}"]["wire_bytes"] >= wt["bytes"]  # the counters saw the payload cross
    assert wt["raw_verifying_stream"]["wire_bytes"] >= wt["bytes"]
    assert set(r["ratios"]) >= {"a_over_c_wire", "c_wire_over_limit", "ship_streams_1_speed_over_raw"}
    assert list(tmp_path.iterdir()) == []  # its lab and files are gone
    # ...and so are its namespaces (named after the bench's pid; another lab running meanwhile has its own).
    assert not {n for n in _netns() - before if n.startswith("ssk-") and n.split("-")[-1].startswith(str(proc.pid))}
