"""`sparkstack tune 1` in the two-host lab: the worker's facts read and its file written over the real sshd.

The lab's hosts share this machine's kernel, so the host root is prepared to need no sysctl: swappiness is 0 and
the page cache small there, and the lab has no nvidia-smi. The one act is the persisted file, written under the
host root by dd and mv over ssh. The plan is checked for exactly that before anything runs.
"""

import json
import os
import sys
from pathlib import Path

from hostfix import write_host

RECIPE = Path(__file__).parents[2] / "recipes/glm53-flash-dflash2-nvfp4/recipe.toml"
TUNE_FILE = "etc/sysctl.d/zz-sparkstack-tune.conf"


def tune(lab, recipe: Path, root: Path, *args: str):
    env = {k: v for k, v in os.environ.items() if k not in ("WORKER_SSH", "HF_HOME")}
    return lab.head.run(sys.executable, "-m", "sparkstack.cli", "tune", "1", *args, "--recipe", str(recipe),
                        "--host-root", str(root), "--ssh-config", str(lab.ssh_config), check=False, env=env, timeout=120)


def test_tune_writes_the_workers_file_over_ssh_then_has_nothing_left_but_the_gpus(lab, tmp_path):
    root = write_host(tmp_path / "root", tuned=False)
    (root / "proc/sys/vm/swappiness").write_text("0\n")  # nothing for sysctl to do: it would reach the real kernel
    text = RECIPE.read_text()
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(text[:text.index("[[nodes]]")] + '[[nodes]]\nhost = "head"\nfabric_ip = "10.0.0.1"\n\n'
                      '[[nodes]]\nhost = "worker"\nssh = "worker"\nfabric_ip = "10.0.0.2"\n\n' + text[text.index("[kv]"):])

    proc = tune(lab, recipe, root, "--dry-run", "--json")
    assert proc.returncode == 0, proc.stderr
    rank = json.loads(proc.stdout)["ranks"][0]
    assert rank["where"] == "worker" and rank["sudo"] is False  # root over ssh: no sudo
    assert [s["step"] for s in rank["steps"]] == ["swappiness-persisted"], rank["steps"]
    programs = {c["argv"][0] for s in rank["steps"] for c in s["commands"]}
    assert programs == {"mkdir", "dd", "mv", "sync"}, programs  # nothing that reaches the kernel's settings
    assert any("nvidia-smi is not installed on worker" in n for n in rank["notes"])  # bash's 127, over ssh
    assert not (root / TUNE_FILE).exists()

    proc = tune(lab, recipe, root)
    assert proc.returncode == 0, proc.stderr
    assert (root / TUNE_FILE).read_text().splitlines()[-1] == "vm.swappiness = 0"
    proc = tune(lab, recipe, root)
    # Nothing left to do, but not "up to date": the lab has no nvidia-smi, so the GPUs were never set.
    assert proc.returncode == 0 and proc.stdout.splitlines() == [
        ("rank 1 (worker): note: nvidia-smi is not installed on worker: persistence mode and the clock cap are "
         "left alone")], proc.stdout + proc.stderr
