"""The flags the pinned vLLM's `vllm serve` takes, recorded from its own parser (checks/tools/record_vllm_flags.py
writes vllm_serve_flags.json beside this file), and how that parser reads a flag: so a dry run with no image
refuses a typo'd flag that would otherwise fail 15 minutes into a boot."""

from __future__ import annotations

import difflib
import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path

from sparkstack.text import printable

FLAGS_FILE = Path(__file__).with_name("vllm_serve_flags.json")
_BEFORE_FIRST_DOT = re.compile(r"(?<=--)[^.]*")


@dataclass(frozen=True)
class ServeFlags:
    vllm: str  # the version whose parser was asked
    kinds: dict[str, str]  # option string -> "switch" | "optional" | "value" (argv_gate.option_kinds)

    def option_of(self, arg: str) -> str | None:
        """The option string vLLM's parser reads `arg` as (its own spelling rules: `_` for `-` before the first
        `.`, `--flag=value`, `--dict-flag.key`, and argparse's unique prefixes), or None when it reads none."""
        key = _BEFORE_FIRST_DOT.sub(lambda m: m.group(0).replace("_", "-"), arg.split("=", 1)[0], count=1)
        key = key.split(".", 1)[0]
        if key in self.kinds:
            return key
        prefixed = [f for f in self.kinds if f.startswith(key)]
        return prefixed[0] if len(prefixed) == 1 else None

    def spelled_out(self, arg: str) -> str:
        """`arg` with its flag written as the option string it reads as (`--max_num_seqs=6` is
        `--max-num-seqs=6`, `--kv-cache-memory` is `--kv-cache-memory-bytes`): one spelling per flag, so a
        knob finds its twin and the image's gate, which takes no abbreviation, takes the argv."""
        option = self.option_of(arg)
        if option is None:
            return arg
        return option + arg[len(arg.split("=", 1)[0].split(".", 1)[0]):]

    def takes_value(self, arg: str) -> bool:
        """Whether `arg`, given alone (no `=`), takes the next arg as its value."""
        option = self.option_of(arg)
        return option is not None and "=" not in arg and self.kinds[option] == "value"  # `--dict.key V` too

    def problem(self, arg: str) -> str | None:
        """What is wrong with `arg` as a flag of `vllm serve`, in words, or None when the parser takes it."""
        if self.option_of(arg) is not None:
            return None
        key = arg.split("=", 1)[0].split(".", 1)[0].replace("_", "-")
        ambiguous = sorted(f for f in self.kinds if f.startswith(key))
        shown = printable(key[:60]) + ("..." if len(key) > 60 else "")  # the key is the recipe author's text
        if ambiguous:
            return (f"{shown} is ambiguous to vLLM {self.vllm}'s `vllm serve`: it begins "
                    f"{', '.join(ambiguous[:4])}{' ...' if len(ambiguous) > 4 else ''}; spell the flag out")
        nearest = difflib.get_close_matches(key, self.kinds, n=1, cutoff=0.6)
        return (f"{shown} is not a flag of vLLM {self.vllm}'s `vllm serve`"
                + (f" (nearest: {nearest[0]})" if nearest else " (`vllm serve --help` lists them)"))


@functools.cache
def serve_flags() -> ServeFlags:
    doc = json.loads(FLAGS_FILE.read_text())
    return ServeFlags(doc["vllm"], dict(doc["flags"]))
