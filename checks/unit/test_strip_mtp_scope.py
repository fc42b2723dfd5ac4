"""The numeric MTP rule covers the language model's decoder stack only: a vision tower's
layers are never MTP by number. Every key below is declared MTP or not by the test author."""

import json

import torch
from safetensors import safe_open

import synth

F32 = torch.float32
# synth.LAYERS = 3: the text stack is layers 0..2, MTP sits at 3.
SCOPE_KEYS = [
    synth.Spec("model.embed_tokens.weight", F32, (4,), False),
    synth.Spec("model.layers.2.mlp.w", F32, (2,), False),
    synth.Spec("model.layers.3.eh_proj.weight", F32, (2,), True),
    synth.Spec("model.language_model.layers.2.w", F32, (2,), False),
    synth.Spec("model.language_model.layers.3.w", F32, (2,), True),
    synth.Spec("language_model.model.layers.0.w", F32, (2,), False),
    synth.Spec("language_model.model.layers.7.w", F32, (2,), True),
    synth.Spec("model.layers.0003.w", F32, (2,), True),  # leading zeros: still layer 3
    # vision towers: more layers than the text stack, never MTP by number
    synth.Spec("model.visual.encoder.layers.5.x", F32, (2,), False),
    synth.Spec("model.visual.blocks.3.attn.qkv.weight", F32, (2,), False),
    synth.Spec("model.vision_tower.layers.3.mlp.w", F32, (2,), False),
    synth.Spec("vision_model.encoder.layers.4.w", F32, (2,), False),
    # the layer prefix must start the key
    synth.Spec("foo.model.layers.9.w", F32, (2,), False),
    # the name rule still holds everywhere, vision tower included
    synth.Spec("model.visual.shared_head.norm", F32, (2,), True),
    synth.Spec("model.visual.encoder.layers.1.nextn.w", F32, (2,), True),
]
OUTSIDE_HIGH = ["foo.model.layers.9.w", "model.vision_tower.layers.3.mlp.w", "model.visual.encoder.layers.5.x",
                "vision_model.encoder.layers.4.w"]


def _read_all(model_dir) -> set[str]:
    keys: set[str] = set()
    for shard in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(shard), "pt") as f:
            keys |= set(f.keys())
    return keys


def test_vision_tower_layers_are_never_mtp_by_number(tmp_path, run_cli):
    flat = tmp_path / "model"
    synth.write_model_dir(flat, shards={"model.safetensors": SCOPE_KEYS})
    proc = run_cli("strip", flat, check=0)
    out = tmp_path / "model-no-MTP"
    assert _read_all(out) == {s.name for s in SCOPE_KEYS if not s.mtp}
    wm = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    assert set(wm) == {s.name for s in SCOPE_KEYS if not s.mtp}

    warnings = [line for line in proc.stderr.splitlines() if line.startswith("sparkstack: warning:")]
    about = [w for w in warnings if any(k in w for k in OUTSIDE_HIGH)]
    assert len(about) == 1, proc.stderr  # one line: how many, and one example
    assert str(len(OUTSIDE_HIGH)) in about[0]


def test_no_scope_warning_without_high_layers_outside_the_text_stack(tmp_path, run_cli):
    specs = [s for s in SCOPE_KEYS if s.name not in OUTSIDE_HIGH]
    flat = tmp_path / "model"
    synth.write_model_dir(flat, shards={"model.safetensors": specs})
    proc = run_cli("strip", flat, check=0)
    assert proc.stderr == ""
    assert _read_all(tmp_path / "model-no-MTP") == {s.name for s in specs if not s.mtp}


def test_layer_index_of_thousands_of_digits(tmp_path, run_cli):
    """Python refuses int() of more than 4300 digits; such a key is still just a (very high) layer."""
    huge = "9" * 5000
    specs = [
        synth.Spec("model.layers.0.w", F32, (2,), False),
        synth.Spec(f"model.layers.{huge}.w", F32, (2,), True),
        synth.Spec(f"model.layers.{'0' * 5000}1.w", F32, (2,), False),  # layer 1, zero-padded
        synth.Spec(f"model.visual.layers.{huge}.w", F32, (2,), False),
    ]
    flat = tmp_path / "model"
    synth.write_model_dir(flat, shards={"model.safetensors": specs})
    proc = run_cli("strip", flat)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert _read_all(tmp_path / "model-no-MTP") == {s.name for s in specs if not s.mtp}
    assert all(len(line) < 1000 for line in proc.stderr.splitlines())
