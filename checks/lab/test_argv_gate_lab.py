"""Preflight's vLLM argv gate through a real dockerd: `docker run --rm --entrypoint python3 IMAGE -c ARGV_GATE
ARGV...`, as `launch --gates` runs it, on every rank's engine argv of the shipped recipe.

The image is a Debian python3 rootfs plus a small `vllm` package whose parser is rebuilt from the real vLLM 0.32's
own option table: every option string, nargs and choices, and the registered tool and reasoning parser names,
dumped in test setup from SPARKSTACK_VLLM_PYTHON's vLLM. Not the real vLLM in the image: that needs torch (about
1 GB per image) and an import of tens of seconds on these 2 cores; the real parser judges the same script directly
in checks/engine/test_vllm_argv.py. This test proves the docker path: argv passing, exit codes, the one line."""

import json
import subprocess

import imagefix
import pytest

from sparkstack.launch.plan import plan_launch_from_recipe
from sparkstack.launch.preflight import argv_gate_checks
from sparkstack.recipe import load_recipe
from sparkstack.remote import Runner

DUMP = """
import json
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.reasoning import ReasoningParserManager
from vllm.tool_parsers import ToolParserManager
from vllm.utils.argparse_utils import FlexibleArgumentParser

p = make_arg_parser(FlexibleArgumentParser(allow_abbrev=False))
actions = [{"opts": a.option_strings, "dest": a.dest, "nargs": a.nargs,
            "choices": None if a.choices is None else [str(c) for c in a.choices]}
           for a in p._actions if a.dest != "help"]
print(json.dumps({"actions": actions, "tool": ToolParserManager.list_registered(),
                  "reasoning": ReasoningParserManager.list_registered()}))
"""

CLI_ARGS = '''
import argparse
import json

TABLE = json.loads(%r)


def make_arg_parser(parser):
    for a in TABLE["actions"]:
        if not a["opts"]:
            parser.add_argument(a["dest"], nargs="?")
        elif a["nargs"] == 0:
            parser.add_argument(*a["opts"], dest=a["dest"], action="store_true")
        else:
            parser.add_argument(*a["opts"], dest=a["dest"], nargs=a["nargs"], choices=a["choices"])
    return parser
'''
MANAGER = '''
import json


class %s:
    @classmethod
    def list_registered(cls):
        return json.loads(%r)
'''
SITE = "usr/lib/python3/dist-packages"
IMAGE = "sparkstack/argv-gate:lab"
BARE = "sparkstack/argv-gate:no-vllm"


@pytest.fixture(scope="session")
def gate_images(dockerd, python_rootfs_tar, tmp_path_factory):
    from vllm_venv import vllm_python

    python = vllm_python()  # the fixture parser is dumped from the real vLLM
    proc = subprocess.run([python, "-c", DUMP], capture_output=True, text=True, timeout=900,
                          env={"VLLM_TARGET_DEVICE": "cpu", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    table = json.loads(proc.stdout.strip().splitlines()[-1])
    files = {
        "vllm/__init__.py": "", "vllm/entrypoints/__init__.py": "", "vllm/entrypoints/launchers/__init__.py": "",
        "vllm/entrypoints/launchers/cli_args.py": CLI_ARGS % json.dumps(table),
        "vllm/utils/__init__.py": "",
        "vllm/utils/argparse_utils.py": "import argparse\n\n\nclass FlexibleArgumentParser(argparse.ArgumentParser):\n"
                                        "    pass\n",
        "vllm/tool_parsers/__init__.py": MANAGER % ("ToolParserManager", json.dumps(table["tool"])),
        "vllm/reasoning/__init__.py": MANAGER % ("ReasoningParserManager", json.dumps(table["reasoning"])),
    }
    entries = []
    for path in sorted(files):
        for d in imagefix._dirs(f"{SITE}/{path}"):
            if d not in entries:
                entries.append(d)
        entries.append((f"{SITE}/{path}", "file", files[path]))
    work = tmp_path_factory.mktemp("argv-gate")
    for tag, layers in ((IMAGE, [("none", python_rootfs_tar), ("none", entries)]),
                        (BARE, [("none", python_rootfs_tar)])):
        layout, tar = work / tag.split(":")[1], work / f"{tag.split(':')[1]}.tar"
        imagefix.write_base(layout, layers=layers, arch="amd64")
        imagefix.layout_to_docker_archive(layout, tar, edit=lambda doc, t=tag: [{**doc[0], "RepoTags": [t]}])
        dockerd.run("load", "-i", str(tar))
    return table


def plan_for(image, tmp_path, **knobs):
    return plan_launch_from_recipe(load_recipe(None), {"HF_HOME": str(tmp_path), "IMAGE": image, **knobs})


def test_the_shipped_recipe_passes_the_gate_in_the_image(gate_images, dockerd, tmp_path):
    checks = argv_gate_checks(plan_for(IMAGE, tmp_path), Runner(docker_host=dockerd.host))
    assert [(c.rank, c.status) for c in checks] == [(0, "pass"), (1, "pass")], [c.line() for c in checks]
    assert all(c.detail.startswith("vLLM accepts the argv") for c in checks)


def test_a_value_outside_the_choices_fails_in_one_line_naming_it(gate_images, dockerd, tmp_path):
    assert "marlin" in next(a["choices"] for a in gate_images["actions"] if "--moe-backend" in a["opts"])
    checks = argv_gate_checks(plan_for(IMAGE, tmp_path, MOE_BACKEND="marlin2"), Runner(docker_host=dockerd.host))
    assert {c.status for c in checks} == {"fail"}
    assert all("--moe-backend" in c.detail and "marlin2" in c.detail and "\n" not in c.detail for c in checks)


def test_an_image_without_vllm_fails_the_gate(gate_images, dockerd, tmp_path):
    checks = argv_gate_checks(plan_for(BARE, tmp_path), Runner(docker_host=dockerd.host))
    assert {c.status for c in checks} == {"fail"}
    assert checks[0].detail.startswith("no vLLM serve argument parser in the image")
