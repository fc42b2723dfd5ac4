"""Every dtype the installed safetensors library writes survives a strip, bit for bit.

Files are written by the library itself (through torch) and read back with it."""

import pytest
import safetensors.torch
import torch
from safetensors import safe_open

import synth

# Every torch dtype safetensors 0.8 can save (its TensorSpec lists them), by torch name.
WRITABLE = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
            "float16", "bfloat16", "float32", "float64", "complex64",
            "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu",
            "float4_e2m1fn_x2"]


def test_the_list_covers_what_the_library_writes():
    """If a newer safetensors learns a dtype, this fails, so the list (and DTYPE_BITS) gets extended."""
    table = getattr(safetensors.torch, "_SIZE", None)
    if table is None:
        pytest.skip("safetensors.torch no longer exposes its dtype table")
    assert {d for d in table if d is not None} <= {getattr(torch, n) for n in WRITABLE}


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.dtype == b.dtype and a.shape == b.shape
            and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)))


@pytest.mark.parametrize("layout", ["flat", "cache"])
def test_every_written_dtype_round_trips(tmp_path, run_cli, layout):
    specs = []
    for name in WRITABLE:
        dtype = getattr(torch, name)
        # Kept and MTP tensors of each dtype share a shard, so the shard is rewritten, not linked.
        specs.append(synth.Spec(f"model.layers.0.{name}.weight", dtype, (4, 2), False))
        specs.append(synth.Spec(f"model.layers.3.{name}.weight", dtype, (2, 8), True))
    flat = tmp_path / "flat"
    tensors = synth.write_model_dir(flat, shards={"model.safetensors": specs[: len(specs) // 2],
                                                  "model-b.safetensors": specs[len(specs) // 2:]})
    src = synth.cache_from_dir(flat, tmp_path / "hub") if layout == "cache" else flat
    before = synth.tree_digest(src)
    proc = run_cli("strip", src, check=0)
    assert "Traceback" not in proc.stderr
    assert synth.tree_digest(src) == before

    dest = src.with_name(src.name + "-no-MTP")
    model_dir = dest / "snapshots" / synth.REVISION if layout == "cache" else dest
    loaded = {}
    for shard in ("model.safetensors", "model-b.safetensors"):
        with safe_open(str(model_dir / shard), "pt") as f:
            loaded.update({k: f.get_tensor(k) for k in f.keys()})
    assert set(loaded) == {s.name for s in specs if not s.mtp}
    for name, tensor in loaded.items():
        assert _same_bits(tensor, tensors[name]), name
