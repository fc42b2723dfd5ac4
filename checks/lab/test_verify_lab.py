"""`sparkstack verify` from the lab's head against the stand-in engine running in a container there, configured
(as a real deployment is) through its environment, with the API key read from VLLM_API_KEY."""

import json
import os
import sys
import time

PORT = 18889
KEY = "lab-verify-key-5e1b"
PATTERN, CYCLES = (3, 1), 3  # STANDIN_ACCEPT_PATTERN / STANDIN_CYCLES below


def verify(lab, *args, key=None):
    env = {**os.environ, "VLLM_API_KEY": key or ""}
    return lab.head.run(sys.executable, "-m", "sparkstack.cli", "verify", f"http://127.0.0.1:{PORT}", *args,
                        "--timeout", "60", check=False, env=env, timeout=120)


def test_verify_against_the_standin_engine_in_a_container(lab_with_image):
    lab, result = lab_with_image
    name = "standin-verify"
    lab.head.docker("run", "-d", "--name", name, "--pull", "never", "--network", "host",
                    "-e", "STANDIN_HEALTH_DELAY=0", "-e", f"STANDIN_API_KEY={KEY}", "-e", "STANDIN_REASONING_TOKENS=6",
                    "-e", f"STANDIN_ACCEPT_PATTERN={','.join(map(str, PATTERN))}", "-e", f"STANDIN_CYCLES={CYCLES}",
                    result["name"], "/models/x", "--port", str(PORT), "--served-model-name", "test/model",
                    "--speculative-config", '{"method":"dflash","model":"/d","num_speculative_tokens":4}')
    try:
        deadline = time.monotonic() + 30
        while (proc := verify(lab, "--json", key=KEY)).returncode != 0 and time.monotonic() < deadline:
            time.sleep(0.3)  # the container's server is not listening yet
        logs = lab.head.docker("logs", name)
        assert proc.returncode == 0, proc.stdout + proc.stderr + logs.stdout + logs.stderr
        checks = {c["check"]: c for c in json.loads(proc.stdout)["checks"]}
        assert {c["status"] for c in checks.values()} == {"pass"}
        assert checks["models"]["detail"] == "asking test/model (the first of 1 served)"
        drafts = len(PATTERN) * CYCLES
        length = 1 + sum(PATTERN) / len(PATTERN)
        rates = "/".join(f"{sum(a > i for a in PATTERN) / len(PATTERN):.2f}" for i in range(4))
        assert checks["spec-decode"]["detail"] == f"acceptance length {length:.2f} over {drafts} drafts, per position {rates}"
        assert "chars of reasoning in `reasoning`" in checks["reasoning"]["detail"]
        assert KEY not in proc.stdout + proc.stderr

        refused = verify(lab)  # no key: the engine refuses /v1/, as vLLM with --api-key does
        lines = refused.stdout.splitlines()
        assert refused.returncode == 1 and lines[0].startswith("pass  health") and "HTTP 401" in lines[1], refused.stdout
        assert len(refused.stderr.splitlines()) == 1 and "Traceback" not in refused.stderr
    finally:
        lab.head.docker("rm", "-f", name, check=False)
