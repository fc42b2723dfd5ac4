"""Record the option strings of the pinned vLLM's own `vllm serve` parser into
python/sparkstack/recipe/vllm_serve_flags.json, so a dry run with no image catches a typo'd engine flag.

Run it with the real vLLM's python (never a sparkstack dependency):

    SPARKSTACK_VLLM_PYTHON=.venv-vllm/bin/python python checks/tools/record_vllm_flags.py [--check]

It asks the parser the argv gate runs in the image (python/sparkstack/launch/argv_gate.py, loaded as a file), so
the flags are exactly the ones that parser accepts. `--check` writes nothing and exits 1 when the file and the
parser disagree (checks/engine/test_vllm_flags.py runs it: the drift test).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GATE = ROOT / "python/sparkstack/launch/argv_gate.py"
OUT = ROOT / "python/sparkstack/recipe/vllm_serve_flags.json"

# Runs inside the vLLM venv: the gate's own account of its parser's option strings.
ASK = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("argv_gate", sys.argv[1])
gate = importlib.util.module_from_spec(spec); spec.loader.exec_module(gate)
import vllm
print(json.dumps({"vllm": vllm.__version__, "flags": dict(sorted(gate.option_kinds().items())),
                  "short": dict(sorted(gate.short_options().items()))}))
"""

def ask(python: str) -> dict:
    proc = subprocess.run([python, "-c", ASK, str(GATE)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "VLLM_TARGET_DEVICE": os.environ.get("VLLM_TARGET_DEVICE", "cpu")})
    if proc.returncode != 0:
        sys.exit(f"record_vllm_flags: the vLLM at {python} did not answer: {proc.stderr.strip()[-400:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def document(found: dict) -> str:
    version = found["vllm"].split("+")[0]
    return json.dumps({"comment": "vllm serve's option strings, as its own parser takes them; made by "
                                  "checks/tools/record_vllm_flags.py: do not edit", "vllm": version,
                       "flags": found["flags"], "short": found["short"]}, indent=1) + "\n"


def main(argv: list[str]) -> int:
    python = os.environ.get("SPARKSTACK_VLLM_PYTHON") or str(ROOT / ".venv-vllm/bin/python")
    text = document(ask(python))
    if "--check" in argv:
        if not OUT.exists() or OUT.read_text() != text:
            old = json.loads(OUT.read_text())["flags"] if OUT.exists() else {}
            new = json.loads(text)["flags"]
            print(f"{OUT.relative_to(ROOT)} differs from the vLLM at {python}: only recorded: "
                  f"{sorted(set(old) - set(new)) or 'none'}; only in vLLM: {sorted(set(new) - set(old)) or 'none'}; "
                  "run checks/tools/record_vllm_flags.py")
            return 1
        print(f"{OUT.relative_to(ROOT)}: {len(json.loads(text)['flags'])} flags, as the vLLM at {python} has them")
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)}: {len(json.loads(text)['flags'])} flags")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
