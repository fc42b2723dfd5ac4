"""A fixture overlay source for the shipped overlay (overlays/dflash2/overlay.toml) whose patch scripts work like
upstream's patch_*.py: every edit is an anchor that must occur exactly once, skipped when its marker is already in
the file, and the result must pass ast.parse. Their anchors are real lines of real vLLM releases, not our own
fixture text; each marker is the text the edit brings in, so a base whose vLLM already carries it is "applied".

- registry_and_select: the DFlash2DraftModel registry entry beside upstream's EagleLlamaForCausalLM line; a
  `get_top_k_tokens` for the LogitsProcessor (the 0.13 class line); `draft_logits_spec` on the speculator.
- glm_aux_capture: the aux hidden-state capture in models/glm5next/nvidia/model.py.
- glm5_drafter_group: let drafter layers through the page-size unification, anchored on 0.13's raise.

Also `tree_layer(root)`: a vllm package dir (its .py files) as one image layer at the overlay's vllm_root.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

VLLM_ROOT = "usr/local/lib/python3.12/dist-packages/vllm"  # overlays/dflash2/overlay.toml's vllm_root

APPLY = '''
import ast
import sys


def apply(path, edits, dry_run=False):
    with open(path) as f:
        text = f.read()
    for marker, anchor, replacement in edits:
        if marker in text:
            continue
        n = text.count(anchor)
        if n != 1:
            sys.exit(f"{path}: the anchor for {marker} occurs {n} times, not once")
        text = text.replace(anchor, replacement)
    ast.parse(text, filename=path)
    if not dry_run:
        with open(path, "w") as f:
            f.write(text)
'''

SCRIPTS = {
    "patch_registry_and_select.py": APPLY + '''
EDITS = {
    "model_executor/models/registry.py": [
        ('"DFlash2DraftModel"',
         '    "EagleLlamaForCausalLM": ("llama_eagle", "EagleLlamaForCausalLM"),\\n',
         '    "EagleLlamaForCausalLM": ("llama_eagle", "EagleLlamaForCausalLM"),\\n'
         '    "DFlash2DraftModel": ("qwen3_dflash2", "DFlash2DraftModel"),  # SM121-PORT\\n'),
    ],
    "model_executor/layers/logits_processor.py": [
        ("def get_top_k_tokens",
         "class LogitsProcessor(CustomOp):\\n",
         "def get_top_k_tokens(logits, k):  # SM121-PORT\\n"
         "    return logits.topk(k, dim=-1).indices\\n\\n\\n"
         "class LogitsProcessor(CustomOp):\\n"),
    ],
    "v1/worker/gpu/spec_decode/speculator.py": [
        ("def draft_logits_spec",
         "class ",
         "def draft_logits_spec(vllm_config):  # SM121-PORT\\n    return None\\n\\n\\nclass "),
    ],
}

root = sys.argv[1]
for rel, edits in EDITS.items():
    apply(f"{root}/{rel}", edits)
''',
    "patch_glm_aux_capture.py": APPLY + '''
import argparse

MARKER = "DFLASH2-AUX-CAPTURE"
EDITS = [
    (MARKER,
     "        for layer in self.layers[self.start_layer:self.end_layer]:\\n",
     "        aux_hidden_states = []  # " + MARKER + "\\n"
     "        for layer in self.layers[self.start_layer:self.end_layer]:\\n"),
]

ap = argparse.ArgumentParser()
ap.add_argument("--model-file", required=True)
ap.add_argument("--dry-run", action="store_true")
a = ap.parse_args()
apply(a.model_file, EDITS, a.dry_run)
''',
    "patch_glm5_drafter_group.py": APPLY + '''
import argparse

MARKER = "DFLASH2-DRAFTER-GROUP"
ANCHOR = ("            if max_page_size % layer_page_size != 0:\\n"
          "                raise NotImplementedError(\\n"
          '                    "The page size of the layer is not divisible by the "\\n')
REPLACEMENT = ("            if max_page_size % layer_page_size != 0 and not getattr(layer_spec, 'drafter', False):"
               "  # " + MARKER + "\\n"
               "                raise NotImplementedError(\\n"
               '                    "The page size of the layer is not divisible by the "\\n')
EDITS = [(MARKER, ANCHOR, REPLACEMENT)]

ap = argparse.ArgumentParser()
ap.add_argument("--kv-file", required=True)
ap.add_argument("--dry-run", action="store_true")
a = ap.parse_args()
apply(a.kv_file, EDITS, a.dry_run)
''',
}

FILES = {
    "qwen3_dflash2.py": "class DFlash2DraftModel:\n    block_size = 8\n",
    "dflash2/__init__.py": "",
    "dflash2/speculator.py": "class DFlash2Speculator:\n    pass\n",
}


def write_source(root: Path, subdir: str = "overlay-dflash2") -> Path:
    for name, text in {**SCRIPTS, **FILES}.items():
        path = root / subdir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def tree_layer(vllm_dir: Path) -> bytes:
    """Every .py file of a vllm package dir, with its dirs, under VLLM_ROOT: one uncompressed layer tar."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        parts = VLLM_ROOT.split("/")
        for i in range(1, len(parts) + 1):
            info = tarfile.TarInfo("/".join(parts[:i]))
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 1_700_000_000
            tar.addfile(info)
        for path in sorted(vllm_dir.rglob("*")):
            rel = path.relative_to(vllm_dir)
            if "__pycache__" in rel.parts or not (path.is_dir() or path.suffix == ".py"):
                continue
            info = tarfile.TarInfo(f"{VLLM_ROOT}/{rel.as_posix()}")
            info.mtime = 1_700_000_000
            if path.is_dir():
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            else:
                data = path.read_bytes()
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()
