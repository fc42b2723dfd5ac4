"""Synthetic checkpoints for the tests: real safetensors files from real torch tensors,
laid out as a real Hugging Face cache entry (checked with huggingface_hub's own scanner).

Every tensor is declared with whether it is MTP, by the test author, so the tests'
expectations never come from the code under test.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from huggingface_hub.utils.sha import git_hash
from safetensors.torch import save_file

REVISION = "0123456789abcdef0123456789abcdef01234567"
LAYERS = 3  # main stack: layers 0..2; MTP sits at layer 3


@dataclass(frozen=True)
class Spec:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    mtp: bool


def _tensor(spec: Spec, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    n = 1
    for d in spec.shape:
        n *= d
    raw = torch.randint(0, 256, (n * torch.empty((), dtype=spec.dtype).element_size(),), generator=g, dtype=torch.uint8)
    return raw.view(spec.dtype).reshape(spec.shape).clone()


# Shards of the default checkpoint. "mixed" holds main and MTP tensors; "mtp-only" only MTP.
DEFAULT_SHARDS: dict[str, list[Spec]] = {
    "model-00001-of-00003.safetensors": [
        Spec("model.embed_tokens.weight", torch.bfloat16, (16, 8), False),
        Spec("model.layers.0.self_attn.q_proj.weight", torch.uint8, (8, 4), False),  # packed FP4
        Spec("model.layers.0.self_attn.q_proj.weight_scale", torch.float8_e4m3fn, (8, 1), False),
        Spec("model.layers.0.self_attn.q_proj.weight_scale_2", torch.float32, (), False),
        Spec("model.layers.1.mlp.gate_proj.weight", torch.uint8, (8, 4), False),
        Spec("model.layers.1.mlp.mtp_proj.weight", torch.bfloat16, (4, 4), False),  # near miss: not exactly "mtp"
        Spec("model.nextn_gate.weight", torch.float32, (4,), False),  # near miss: not exactly "nextn"
    ],
    "model-00002-of-00003.safetensors": [  # mixed
        Spec("model.layers.2.mlp.down_proj.weight", torch.uint8, (4, 8), False),
        Spec("model.layers.2.mlp.down_proj.weight_scale", torch.float8_e4m3fn, (4, 2), False),
        Spec("model.layers.3.eh_proj.weight", torch.bfloat16, (8, 8), True),
        Spec("model.layers.3.enorm.weight", torch.float32, (8,), True),
        Spec("model.norm.weight", torch.bfloat16, (8,), False),
        Spec("model.mtp.embed.weight", torch.float8_e4m3fn, (4, 4), True),
        Spec("lm_head.weight", torch.bfloat16, (16, 8), False),
    ],
    "model-00003-of-00003.safetensors": [  # MTP only
        Spec("model.layers.3.shared_head.norm.weight", torch.bfloat16, (8,), True),
        Spec("model.layers.3.mlp.experts.0.weight", torch.uint8, (8, 4), True),
        Spec("model.nextn.proj.weight", torch.float32, (2, 2), True),
        Spec("model.mtp_layers.0.w", torch.float8_e4m3fn, (2, 4), True),
        Spec("model.layers.17.x.weight", torch.float32, (3,), True),  # any index >= num_hidden_layers
    ],
}


def base_config(text_config: bool) -> dict:
    if text_config:
        return {
            "architectures": ["Glm5NextForConditionalGeneration"],
            "model_type": "glm5next",
            "text_config": {"num_hidden_layers": LAYERS, "num_nextn_predict_layers": 1,
                            "index_share_for_mtp_iteration": True, "hidden_size": 8},
            "num_nextn_predict_layers": 1,
        }
    return {"architectures": ["Glm5NextForCausalLM"], "num_hidden_layers": LAYERS,
            "num_nextn_predict_layers": 1, "index_share_for_mtp_iteration": True}


def write_model_dir(path: Path, shards: dict[str, list[Spec]] | None = None, config: dict | None = None,
                    index: bool = True, extra_files: dict[str, bytes] | None = None) -> dict[str, torch.Tensor]:
    """Write a flat model dir. Returns every tensor by name."""
    shards = DEFAULT_SHARDS if shards is None else shards
    path.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    weight_map = {}
    seed = 0
    for shard, specs in shards.items():
        group = {}
        for spec in specs:
            seed += 1
            group[spec.name] = _tensor(spec, seed)
            weight_map[spec.name] = shard
        save_file(group, str(path / shard), metadata={"format": "pt"})
        tensors.update(group)
    (path / "config.json").write_text(json.dumps(base_config(True) if config is None else config, indent=2))
    if index:
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        (path / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    for rel, data in (extra_files or {"tokenizer_config.json": b'{"x": 1}\n', "chat_template_mm.jinja": b"{{ messages }}\n"}).items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_bytes(data)
    return tensors


def cache_from_dir(flat: Path, hub: Path, repo_id: str = "LibertAIDAI/GLM-5.3-Flash-NVFP4",
                   revision: str = REVISION) -> Path:
    """Lay a flat model dir out as hub/models--ORG--NAME, named as the hub names blobs."""
    entry = hub / ("models--" + repo_id.replace("/", "--"))
    snap = entry / "snapshots" / revision
    (entry / "blobs").mkdir(parents=True, exist_ok=True)
    snap.mkdir(parents=True, exist_ok=True)
    for src in sorted(p for p in flat.rglob("*") if p.is_file()):
        rel = src.relative_to(flat)
        data = src.read_bytes()
        blob = hashlib.sha256(data).hexdigest() if src.suffix == ".safetensors" else git_hash(data)
        if not (entry / "blobs" / blob).exists():
            shutil.copyfile(src, entry / "blobs" / blob)
        link = snap / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(entry / "blobs" / blob, link.parent), link)
    (entry / "refs").mkdir(exist_ok=True)
    (entry / "refs" / "main").write_text(revision)
    return entry


def tree_digest(root: Path) -> str:
    """Hash of a tree: every path, link target, mode and file content. Used to prove SRC is untouched."""
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        st = p.lstat()
        h.update(f"{rel}\0{st.st_mode:o}\0".encode())
        if p.is_symlink():
            h.update(os.readlink(p).encode())
        elif p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


def write_raw_shard(path: Path, tensors: list[tuple[str, int]], fill: bytes) -> None:
    """A valid safetensors file of U8 tensors (name, nbytes), written fast from a repeated fill block."""
    from sparkstack.safetensors_header import TensorEntry, encode_header

    entries = tuple(TensorEntry(name, "U8", (n,), 0, n) for name, n in tensors)
    prefix, _ = encode_header((("format", "pt"),), entries)
    with open(path, "wb") as f:
        f.write(prefix)
        for _, n in tensors:
            while n > 0:
                k = min(n, len(fill))
                f.write(fill[:k])
                n -= k
