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
    short: dict[str, str]  # single-dash option string -> the long one it stands for (argv_gate.short_options)

    def _short_split(self, arg: str) -> tuple[str, str] | None:
        """(long option, what of `arg` follows its short form) for a single-dash `arg`, as vLLM reads it: `-O3` and
        `-O=3` are its own rewrite to --optimization-level; then argparse's rules: `-tp` or `-tp=2` exactly, a
        one-letter option with its value attached (`-qfp8`), or a unique prefix of one (`-t`); `-cc.mode` is a key
        of a dict flag, as vLLM reads `--compilation-config.mode`."""
        if arg.startswith("-O") and arg != "-O":
            return "--optimization-level", "=" + arg[3:] if arg[2] == "=" else "=" + arg[2:]
        if arg == "-O":  # vLLM rewrites `-O N` (N 0 to 3) only; anything else reaches argparse as an unknown -O
            return "--optimization-level", ""
        key, eq, value = arg.partition("=")
        if key in self.short:
            return self.short[key], eq + value
        if key.split(".", 1)[0] in self.short:  # a dict flag's key: -cc.mode is --compilation-config.mode
            head = key.split(".", 1)[0]
            return self.short[head], arg[len(head):]
        if len(arg) > 2 and arg[:2] in self.short:
            return self.short[arg[:2]], "=" + arg[2:]
        prefixed = [s for s in self.short if s.startswith(arg)] if not eq else []
        return (self.short[prefixed[0]], "") if len(prefixed) == 1 else None

    def option_of(self, arg: str) -> str | None:
        """The option string vLLM's parser reads `arg` as (its own spelling rules: `_` for `-` before the first
        `.`, `--flag=value`, `--dict-flag.key`, and argparse's unique prefixes), or None when it reads none."""
        if not arg.startswith("--"):
            split = self._short_split(arg)
            return split[0] if split else None
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
        if not arg.startswith("--"):  # -tp 2 is --tensor-parallel-size 2, -O3 is --optimization-level=3
            split = self._short_split(arg)
            return arg if split is None else split[0] + split[1]
        option = self.option_of(arg)
        if option is None:
            return arg
        return option + arg[len(arg.split("=", 1)[0].split(".", 1)[0]):]

    def takes_value(self, arg: str) -> bool:
        """Whether `arg`, given alone (no `=`), takes the next arg as its value."""
        option = self.option_of(arg)
        if option is None or "=" in self.spelled_out(arg):
            return False
        return self.kinds[option] == "value"  # `--dict.key V` too

    def problem(self, arg: str) -> str | None:
        """What is wrong with `arg` as a flag of `vllm serve`, in words, or None when the parser takes it."""
        if self.option_of(arg) is not None:
            return None
        if not arg.startswith("--"):
            shown = printable(arg[:20]) + ("..." if len(arg) > 20 else "")
            near = sorted(s for s in self.short if s.startswith(arg[:2]))
            return (f"{shown} is not a flag of vLLM {self.vllm}'s `vllm serve` (its short flags beginning "
                    f"{printable(arg[:2])}: {', '.join(near)}; or spell the flag out)" if near else
                    f"{shown} is not a flag of vLLM {self.vllm}'s `vllm serve` (`vllm serve --help` lists them)")
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
    return ServeFlags(doc["vllm"], dict(doc["flags"]), dict(doc["short"]))
