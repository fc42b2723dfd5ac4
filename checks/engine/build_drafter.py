"""A tiny DFlash (v1) drafter with real, hand-set weights, for build_model.py's target; no download, no training.

Run it with the vLLM venv's python, like build_model.py:
    python build_drafter.py OUT_DIR [--target TARGET_DIR] [--lag L]
and serve it beside the target with
    --speculative-config '{"method":"dflash","model":"OUT_DIR","num_speculative_tokens":N}'

What vLLM 0.32 needs (vllm/model_executor/models/qwen3_dflash.py, vllm/v1/spec_decode/dflash.py):
- config.json: a Qwen3 config (model_type "qwen3") with architectures ["DFlashDraftModel"] and
  dflash_config = {"mask_token_id": M, "target_layer_ids": [0]}. vLLM wraps it in its EAGLEConfig; the registry
  maps DFlashDraftModel to qwen3_dflash.DFlashQwen3ForCausalLM. target_layer_ids are DFlash ids: vLLM adds 1
  (eagle3_utils.get_eagle3_aux_layers_from_config), so [0] is the target's hidden state after its layer 0.
- model.safetensors with the names a z-lab DFlash checkpoint uses (no "model." prefix; vLLM adds it):
  fc.weight [H, H*len(target_layer_ids)], hidden_norm.weight, norm.weight, layers.0.{input_layernorm,
  post_attention_layernorm}.weight, layers.0.self_attn.{q,k,v,o}_proj.weight, layers.0.self_attn.{q,k}_norm.weight,
  layers.0.mlp.{gate,up,down}_proj.weight, and here also embed_tokens.weight and lm_head.weight (the drafter's own;
  without them vLLM shares the target's). load_weights ends in _build_fused_kv_buffers(): that is the buffer a
  `--load-format dummy` drafter never gets (vLLM then warns "DFlash buffer initialization was skipped").

How DFlash drafts (one pass, "parallel drafting"): after each target step the drafter writes K/V for the step's
context tokens into its own KV cache, computed from the target's hidden states (fc, then hidden_norm, then the
layer's k/v projections). It then runs one query block of N+1 slots at positions p..p+N: the token the target just
sampled (the bonus, at p) and N copies of mask_token_id; the outputs at the N mask slots are the N drafts. The block
attends non-causally to the context and to itself.

The hand-set weights (H = vocab = 128, 2 heads of 64, as the target):
- Context states: the target's layer-0 output is its one-hot embedding (attention and MLP are zero), fc = identity,
  so the context state of position n is one-hot(token[n]). The drafter's own embed_tokens is one-hot too.
- q_proj and k_proj are all ones, so every query and every key (context or block, any token) is the constant
  all-ones vector before the per-head q_norm/k_norm; those norms' weights then ARE the query and key. They are set
  so that after RoPE (neox, rope_theta 10000) the score is sum_i A*cos((m - n - LAG)*theta_i) over the 16 fastest
  frequency pairs: a query at position m attends to the position exactly LAG back. Its margin over any other offset
  (up to 32768) is 1.08*A/8 logits (A = 320: 43 logits), so the attention is a hard copy.
- v_proj and o_proj are identities, the MLP is zero, all norms are 1: the slot at p+k ends up holding
  one-hot(token[p+k-LAG]) (plus its own mask embedding, 11x smaller).
- lm_head is succ^LAG (the target's successor map applied LAG times) with weight 10, so the draft for p+k is
  succ^LAG(token[p+k-LAG]). The mask token maps to itself, a token the target never writes.

So the drafts are the target's own continuation wherever token[p+k-LAG] is known (k <= LAG: it is in the context or
is the bonus) and was itself produced by the successor rule (p+k-LAG >= the last prompt position). Expected figures
(greedy, or temperature 1, where the target's choice has probability 1 - 127e^-113):
- with num_speculative_tokens N <= LAG: after a warm-up of LAG-2 steps (tokens whose drafts reach back into the
  prompt and are rejected at position 0), every draft is accepted: per-position acceptance ~1 at every position,
  mean acceptance length N+1. --simulate prints the exact counters for a prompt and max_tokens.
- with N > LAG: slots k > LAG copy a mask slot and draft the mask token, never accepted: positions 0..LAG-1 ~1,
  positions LAG.. exactly 0. E.g. --lag 2 with N 4 gives per-position rates [~1, ~1, 0, 0]: a shape a bench can check.
LAG defaults to 4 (the engine tier's num_speculative_tokens). A LAG of 1 drafts succ(bonus) at position 0 only.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import build_model  # noqa: E402  (vocabulary and successor map of the default target)

HEAD_DIM = 64
ROPE_THETA = 10000.0
PAIRS_USED = 16  # the 16 fastest of the 32 rotary pairs; the slow ones barely separate neighbouring offsets
SCORE_A = 320.0  # per pair |q||k|: peak logit 16*A/8 = 640, margin over any other offset 1.08*A/8 = 43
LM_SCALE = 10.0
DEFAULT_LAG = 4


def target_successors(target: Path | None) -> tuple[list[int], int, int]:
    """(succ as a list: succ[t] = the token the target writes after t, vocab size, mask token id).
    From the target's lm_head when a target dir is given (argmax of each column), else from build_model."""
    if target is None:
        tokens = build_model.vocabulary()
        ids = {t: i for i, t in enumerate(tokens)}
        succ_map = build_model.successors(tokens)
        vocab = build_model.VOCAB_SIZE
        succ = [ids[succ_map[t]] if t in succ_map else ids[build_model.PAD] for t in tokens]
        succ += [ids[build_model.PAD]] * (vocab - len(succ))
        return succ, vocab, ids[build_model.PAD]
    from safetensors import safe_open
    with safe_open(str(target / "model.safetensors"), "pt") as f:
        head = f.get_tensor("lm_head.weight")
    config = json.loads((target / "config.json").read_text())
    succ = head.argmax(dim=0).tolist()
    return succ, head.shape[0], config.get("pad_token_id", 0)


def rotary_pattern(lag: int) -> tuple[list[float], list[float]]:
    """q_norm and k_norm weights (neox layout: pair i is dims i and i+32) giving score A*cos((m-n-lag)*theta_i)."""
    half = HEAD_DIM // 2
    q, k = [0.0] * HEAD_DIM, [0.0] * HEAD_DIM
    r = math.sqrt(SCORE_A)
    for i in range(PAIRS_USED):
        theta = ROPE_THETA ** (-2 * i / HEAD_DIM)
        q[i], q[i + half] = r * math.cos(lag * theta), -r * math.sin(lag * theta)
        k[i] = r
    return q, k


def power(succ: list[int], n: int, t: int) -> int:
    for _ in range(n):
        t = succ[t]
    return t


def build(out: Path, target: Path | None, lag: int) -> None:
    import torch
    from safetensors.torch import save_file

    succ, vocab, mask = target_successors(target)
    h, inter, heads = vocab, 64, 2
    assert heads * HEAD_DIM == h, (heads, HEAD_DIM, h)
    config = {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3",
        "vocab_size": vocab, "hidden_size": h, "intermediate_size": inter, "num_hidden_layers": 1,
        "num_attention_heads": heads, "num_key_value_heads": heads, "head_dim": HEAD_DIM, "hidden_act": "silu",
        "max_position_embeddings": 8192, "rms_norm_eps": 1e-6, "attention_bias": False,
        "rope_parameters": {"rope_type": "default", "rope_theta": ROPE_THETA}, "rope_theta": ROPE_THETA,
        "tie_word_embeddings": False, "torch_dtype": "float32", "dtype": "float32",
        "num_target_layers": 1, "block_size": lag + 1,
        "dflash_config": {"mask_token_id": mask, "target_layer_ids": [0]},
        # not read by vLLM: what the weights do, for whoever opens the file
        "sparkstack_hand_set": {"lag": lag, "draft": f"succ^{lag}(token[p+k-{lag}])", "pairs": PAIRS_USED,
                                "score_a": SCORE_A},
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")

    lm_head = torch.zeros(vocab, h)
    for t in range(vocab):
        lm_head[mask if t == mask else power(succ, lag, t), t] = LM_SCALE
    q_norm, k_norm = rotary_pattern(lag)
    weights = {
        "embed_tokens.weight": torch.eye(vocab, h),
        "lm_head.weight": lm_head,
        "fc.weight": torch.eye(h, h),
        "hidden_norm.weight": torch.ones(h),
        "norm.weight": torch.ones(h),
        "layers.0.input_layernorm.weight": torch.ones(h),
        "layers.0.post_attention_layernorm.weight": torch.ones(h),
        "layers.0.self_attn.q_proj.weight": torch.ones(heads * HEAD_DIM, h),
        "layers.0.self_attn.k_proj.weight": torch.ones(heads * HEAD_DIM, h),
        "layers.0.self_attn.v_proj.weight": torch.eye(heads * HEAD_DIM, h),
        "layers.0.self_attn.o_proj.weight": torch.eye(h, heads * HEAD_DIM),
        "layers.0.self_attn.q_norm.weight": torch.tensor(q_norm),
        "layers.0.self_attn.k_norm.weight": torch.tensor(k_norm),
        "layers.0.mlp.gate_proj.weight": torch.zeros(inter, h),
        "layers.0.mlp.up_proj.weight": torch.zeros(inter, h),
        "layers.0.mlp.down_proj.weight": torch.zeros(h, inter),
    }
    save_file({k: v.contiguous() for k, v in weights.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})


def simulate(prompt: list[int], succ: list[int], mask: int, lag: int, n: int, max_tokens: int) -> dict:
    """The spec-decode counters one greedy request should add: the target writes succ(previous token); after
    every target step the drafter proposes, for k = 1..n, succ^lag(token[p+k-lag]) when that position is known
    (else the mask token), p being the position of the token the target just wrote; the longest agreeing prefix
    is accepted, then the target adds its own token. As vLLM 0.32 counts it (checked on the CPU build): n drafts
    every step while the request is short of max_tokens, and a step's accepted drafts count in full even when
    they run past max_tokens (the text is cut, the counters are not)."""
    seq = list(prompt)
    seq.append(succ[seq[-1]])  # the prefill's token
    generated, drafts, accepted, per_pos = 1, 0, 0, [0] * n
    while generated < max_tokens:
        p = len(seq) - 1
        proposal = [power(succ, lag, seq[p + k - lag]) if k <= lag else mask for k in range(1, n + 1)]
        drafts += 1
        for k, d in enumerate(proposal):
            if d != succ[seq[-1]]:
                break
            seq.append(d)
            per_pos[k] += 1
            accepted += 1
            generated += 1
        seq.append(succ[seq[-1]])  # the target's own token after the accepted prefix
        generated += 1
    return {"num_drafts": drafts, "num_draft_tokens": drafts * n, "num_accepted_tokens": accepted,
            "accepted_per_pos": per_pos, "per_pos_rate": [round(a / drafts, 3) for a in per_pos] if drafts else [],
            "mean_acceptance_length": round(1 + accepted / drafts, 3) if drafts else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--target", type=Path, help="the target model dir (default: build_model.py's vocabulary)")
    ap.add_argument("--lag", type=int, default=DEFAULT_LAG, help="draft token[p+k-LAG] moved on LAG steps")
    ap.add_argument("--simulate", metavar="N", type=int,
                    help="also print the counters a plain chat turn 'hi' should give with N speculative tokens")
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    build(args.out, args.target, args.lag)
    if args.simulate:
        if args.target:
            from transformers import AutoTokenizer
            tok = AutoTokenizer.from_pretrained(str(args.target))
            prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                             tokenize=True)
            if not isinstance(prompt, list):  # transformers 5 returns a BatchEncoding
                prompt = prompt["input_ids"]
        else:  # build_model's template: <|user|>hi<|assistant|>, one token per character
            ids = {t: i for i, t in enumerate(build_model.vocabulary())}
            prompt = [ids["<|user|>"], ids["h"], ids["i"], ids["<|assistant|>"]]
        succ, _, mask = target_successors(args.target)
        print(json.dumps(simulate(list(prompt), succ, mask, args.lag, args.simulate, args.max_tokens)))


if __name__ == "__main__":
    main()
