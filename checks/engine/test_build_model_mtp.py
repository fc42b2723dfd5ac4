"""build_model.py's --mtp option, read back with safetensors and stripped by sparkstack's own `strip`; no server.

The default build must stay what the engine tier serves (no index, no layer 1, no num_nextn_predict_layers); --mtp
adds a GLM-style MTP layer at index num_hidden_layers (what vLLM's Llama loader refuses, see DRAFTER-NOTES.md), and
strip must give back exactly the default's tensors, with the MTP count set to 0.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from clirun import sparkstack_cmd
from safetensors import safe_open

HERE = Path(__file__).parent
LAYER0 = ("input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_proj.weight",
          "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight", "mlp.gate_proj.weight",
          "mlp.up_proj.weight", "mlp.down_proj.weight")
MTP_EXTRA = ("enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight", "shared_head.head.weight")


def _build(vllm_py: str, out: Path, *flags: str) -> Path:
    subprocess.run([vllm_py, str(HERE / "build_model.py"), str(out), *flags], check=True, capture_output=True,
                   cwd=out.parent, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    return out


def _tensors(model: Path) -> dict:
    with safe_open(str(model / "model.safetensors"), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


# In the engine servers' group: "plain" is then the very model they serve (conftest's tiny_model, built once per
# worker), not a second build of it.
pytestmark = pytest.mark.xdist_group("vllm")


@pytest.fixture(scope="module")
def built(vllm_py, tiny_model, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("build-model-mtp")
    return {"plain": tiny_model, "mtp": _build(vllm_py, root / "mtp", "--mtp")}


def test_default_build_has_no_mtp(built):
    plain = built["plain"]
    assert not (plain / "model.safetensors.index.json").exists()
    assert "num_nextn_predict_layers" not in json.loads((plain / "config.json").read_text())
    assert not [k for k in _tensors(plain) if k.startswith("model.layers.1.")]


def test_mtp_build_adds_a_glm_style_layer(built):
    plain, mtp = _tensors(built["plain"]), _tensors(built["mtp"])
    config = json.loads((built["mtp"] / "config.json").read_text())
    assert config["num_nextn_predict_layers"] == 1 and config["num_hidden_layers"] == 1
    extra = {k for k in mtp if k not in plain}
    assert extra == {f"model.layers.1.{n}" for n in LAYER0 + MTP_EXTRA}
    for name in LAYER0:
        assert mtp[f"model.layers.1.{name}"].shape == plain[f"model.layers.0.{name}"].shape
    h = plain["model.norm.weight"].shape[0]
    assert mtp["model.layers.1.eh_proj.weight"].shape == (h, 2 * h)
    assert mtp["model.layers.1.enorm.weight"].shape == mtp["model.layers.1.hnorm.weight"].shape == (h,)
    assert mtp["model.layers.1.shared_head.norm.weight"].shape == (h,)
    assert (mtp["model.layers.1.shared_head.head.weight"] == plain["lm_head.weight"]).all()
    for k, v in plain.items():  # the main stack is the default's, tensor for tensor
        assert (mtp[k] == v).all(), k
    index = json.loads((built["mtp"] / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(mtp) and set(index["weight_map"].values()) == {"model.safetensors"}
    assert index["metadata"]["total_size"] == sum(v.numel() * v.element_size() for v in mtp.values())


def test_strip_gives_back_the_default_model(built, tmp_path):
    out = tmp_path / "stripped"
    proc = subprocess.run([*sparkstack_cmd(), "strip", str(built["mtp"]), "--out", str(out)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    plain, stripped = _tensors(built["plain"]), _tensors(out)
    assert set(stripped) == set(plain)
    for k, v in plain.items():
        assert (stripped[k] == v).all(), k
    config = json.loads((out / "config.json").read_text())
    assert config["num_nextn_predict_layers"] == 0
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(plain)
