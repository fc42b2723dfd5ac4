"""A tiny model whose every answer is known in advance, built with transformers and tokenizers, no download.

Run it with the vLLM venv's python (it has transformers, tokenizers and torch):  python build_model.py OUT_DIR [--mtp]

The model is a one-layer Llama whose next token depends only on the current one: the embeddings are one-hot
(hidden size = vocabulary size), attention and MLP weights are zero (the residual carries the embedding through),
the norms are 1, and lm_head maps token i to its successor with weight 10. After the final RMSNorm the one-hot
vector has length sqrt(V), so the successor's logit is 10*sqrt(128) = 113.1 and every other logit 0: the right
token has probability 1 - 127*e^-113.1, any other e^-113.1 (logprob -113.1).

What comes after what (SUCCESSORS below) makes vLLM's GLM parsers (glm45 reasoning, glm47 tools) see GLM-shaped
output:
- a plain turn ends its prompt in <|assistant|>; the model then writes
  <think>okay</think>0123456789012... : reasoning "okay", then a cycle of digits until max_tokens. ngram drafting
  follows the cycle, so acceptance nears its ceiling.
- a turn with tools ends its prompt in <|assistant|><think></think> and a newline (thinking closed, as GLM's
  template writes it with thinking off); the model then writes the one call verify asks for:
  <tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value><arg_key>unit</arg_key>
  <arg_value>celsius</arg_value></tool_call> and its end-of-sequence token.
Each token has one successor, so a string that occurs twice in an answer needs two tokens: the second argument's
opening markup is one added token of its own.

With --mtp (off by default) the checkpoint also carries a GLM-style MTP (multi-token prediction) layer, as
GLM-4.5/4.7 and GLM-5.3 checkpoints do (names as vllm/model_executor/models/glm4_moe_mtp.py and
vllm/models/glm5next/common/mtp.py load them): a layer at index num_hidden_layers (model.layers.1.*) with layer 0's
tensors and shapes, plus model.layers.1.enorm / hnorm (RMSNorm weights), eh_proj (hidden x 2*hidden) and
shared_head.norm / shared_head.head (vocab x hidden), `num_nextn_predict_layers: 1` in config.json, and a
model.safetensors.index.json (real GLM checkpoints are sharded; sparkstack strip reads the index). vLLM's Llama loader
has no layer 1, so this checkpoint does not load until strip has removed those tensors and set the count to 0.
The MTP weights are set, not random: enorm/hnorm 1, eh_proj [I | 0] (it passes the token's embedding), the block's
tensors zero like layer 0's, shared_head.head = lm_head, so an MTP head would predict the successor too.

The tags are added tokens that are not "special": decoded with skip_special_tokens (vLLM's default without a
parser), they stay in the text, so a server without parsers shows the markup in content, as a real GLM does.
"""

import json
import string
import sys
from pathlib import Path

ROLES = ["<|system|>", "<|user|>", "<|assistant|>", "<|observation|>"]
EOS = "<|endoftext|>"
UNK = "<|unk|>"
PAD = "<|pad|>"
TAGS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>",
        "</arg_value>"]
WORDS = ["get_weather", "city", "Paris", "celsius", "</arg_value><arg_key>unit</arg_key><arg_value>"]
CHARS = [c for c in string.printable if c not in "\x0b\x0c\r"]  # 97: letters, digits, punctuation, space, \t, \n
VOCAB_SIZE = 128
CYCLE = "0123456789"
REASONING = "okay"
TOOL_CHAIN = ["\n", "<tool_call>", "get_weather", "<arg_key>", "city", "</arg_key>", "<arg_value>", "Paris",
              "</arg_value><arg_key>unit</arg_key><arg_value>", "celsius", "</arg_value>", "</tool_call>", EOS]
PLAIN_CHAIN = ["<|assistant|>", "<think>", *REASONING, "</think>", *CYCLE]

CHAT_TEMPLATE = (
    "{%- for m in messages -%}"
    "{%- set role = 'observation' if m.role == 'tool' else m.role -%}"
    "<|{{ role }}|>"
    "{%- if m.content is string -%}{{ m.content }}"
    "{%- elif m.content -%}{%- for part in m.content if part.type == 'text' -%}{{ part.text }}{%- endfor -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if tools -%}<|system|>tools:{%- for t in tools -%}{{ ' ' + t.function.name }}{%- endfor -%}{%- endif -%}"
    "{%- if add_generation_prompt -%}<|assistant|>{%- if tools -%}<think></think>{{ '\\n' }}{%- endif -%}{%- endif -%}"
)


def vocabulary() -> list[str]:
    tokens = [PAD, UNK, EOS, *ROLES, *TAGS, *WORDS, *CHARS]
    assert len(tokens) == len(set(tokens)) and len(tokens) <= VOCAB_SIZE, len(tokens)
    return tokens


def successors(tokens: list[str]) -> dict[str, str]:
    """Token -> the token the model writes after it. Tokens on no chain go back into the digit cycle, so a
    corrupted sample is followed by more samples rather than an early end."""
    succ = {t: CYCLE[0] for t in tokens}
    for chain in (PLAIN_CHAIN, TOOL_CHAIN):
        for a, b in zip(chain, chain[1:]):
            succ[a] = b
    succ[CYCLE[-1]] = CYCLE[0]
    succ[EOS] = EOS
    return succ


MTP_EXTRA = ("enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight", "shared_head.head.weight")


def mtp_tensors(weights: dict, num_hidden_layers: int) -> dict:
    """GLM-style MTP tensors for a layer at index num_hidden_layers: layer 0's tensors under the new index, plus
    enorm, hnorm, eh_proj and shared_head.{norm,head}."""
    import torch

    h = weights["model.norm.weight"].shape[0]
    src, dst = "model.layers.0.", f"model.layers.{num_hidden_layers}."
    out = {dst + k[len(src):]: v.clone() for k, v in weights.items() if k.startswith(src)}
    out[dst + "enorm.weight"] = torch.ones(h)
    out[dst + "hnorm.weight"] = torch.ones(h)
    out[dst + "eh_proj.weight"] = torch.cat([torch.eye(h), torch.zeros(h, h)], dim=1)
    out[dst + "shared_head.norm.weight"] = torch.ones(h)
    out[dst + "shared_head.head.weight"] = weights["lm_head.weight"].clone()
    return out


def build(out: Path, mtp: bool = False) -> None:
    import torch
    from safetensors.torch import save_file
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, PreTrainedTokenizerFast

    tokens = vocabulary()
    ids = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.WordLevel(vocab=ids, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([PAD, UNK, EOS, *ROLES])
    tok.add_tokens([*TAGS, *WORDS])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, unk_token=UNK, pad_token=PAD,
                                   model_max_length=8192)
    fast.chat_template = CHAT_TEMPLATE
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out)

    config = LlamaConfig(vocab_size=VOCAB_SIZE, hidden_size=VOCAB_SIZE, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, head_dim=VOCAB_SIZE // 2,
                         max_position_embeddings=8192, rms_norm_eps=1e-6, tie_word_embeddings=False,
                         bos_token_id=ids[EOS], eos_token_id=ids[EOS], pad_token_id=ids[PAD], torch_dtype="float32")
    if mtp:
        config.num_nextn_predict_layers = 1
    config.save_pretrained(out)
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": ids[EOS], "pad_token_id": ids[PAD]}))

    h, inter = VOCAB_SIZE, 64
    succ = successors(tokens)
    lm_head = torch.zeros(VOCAB_SIZE, h)
    for t, n in succ.items():
        lm_head[ids[n], ids[t]] = 10.0
    weights = {
        "model.embed_tokens.weight": torch.eye(VOCAB_SIZE, h),
        "lm_head.weight": lm_head,
        "model.norm.weight": torch.ones(h),
        "model.layers.0.input_layernorm.weight": torch.ones(h),
        "model.layers.0.post_attention_layernorm.weight": torch.ones(h),
    }
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        weights[f"model.layers.0.self_attn.{name}.weight"] = torch.zeros(h, h)
    weights["model.layers.0.mlp.gate_proj.weight"] = torch.zeros(inter, h)
    weights["model.layers.0.mlp.up_proj.weight"] = torch.zeros(inter, h)
    weights["model.layers.0.mlp.down_proj.weight"] = torch.zeros(h, inter)
    if mtp:
        weights.update(mtp_tensors(weights, config.num_hidden_layers))
    save_file({k: v.contiguous() for k, v in weights.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    if mtp:
        index = {"metadata": {"total_size": sum(v.numel() * v.element_size() for v in weights.values())},
                 "weight_map": {k: "model.safetensors" for k in sorted(weights)}}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--mtp"]
    if len(args) != 1:
        sys.exit("usage: build_model.py OUT_DIR [--mtp]")
    build(Path(args[0]), mtp="--mtp" in sys.argv[1:])
