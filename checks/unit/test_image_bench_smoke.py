"""The image benchmark runs end to end at a tiny size. Only byte counts are asserted, never times."""

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).parents[1] / "bench" / "image_bench.py"


def test_image_bench_rebuild_reads_no_base_bytes(tmp_path):
    proc = subprocess.run([sys.executable, str(BENCH), "--big-mib", "4", "--workdir", str(tmp_path), "--json"],
                          capture_output=True, text=True, check=True)
    r = json.loads(proc.stdout)
    assert r["full_build_layer_bytes_read"] > r["big_layer_bytes"]
    assert r["rebuild_layer_bytes_read"] == 0
    assert r["full_manifest"] != r["rebuild_manifest"] and r["base_layers_shared"]
    assert list(tmp_path.iterdir()) == []
