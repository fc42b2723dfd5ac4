
import sys


class Refused(Exception):
    pass


def _first(*imports):
    for module, name in imports:
        try:
            return getattr(__import__(module, fromlist=[name]), name)
        except (ImportError, AttributeError):
            continue
    return None


def parser(allow_abbrev=False):
    make = _first(("vllm.entrypoints.launchers.cli_args", "make_arg_parser"),
                  ("vllm.entrypoints.openai.cli_args", "make_arg_parser"))
    flexible = _first(("vllm.utils.argparse_utils", "FlexibleArgumentParser"), ("vllm.utils", "FlexibleArgumentParser"))
    if make is None or flexible is None:
        return None
    p = make(flexible(allow_abbrev=allow_abbrev))

    def error(message):
        raise Refused(message)

    p.error = error  # argparse reports unknown options and bad choices through error(): one line, no exit
    return p


def option_kinds():
    """Every long option string of `vllm serve`, and what follows it: "switch" (nothing), "optional" (a value
    or nothing) or "value". checks/tools/record_vllm_flags.py records this for dry runs with no image."""
    kinds = {0: "switch", "?": "optional"}
    return {s: kinds.get(a.nargs, "value") for a in parser()._actions for s in a.option_strings if s.startswith("--")}


def short_options():
    """Every single-dash option string of `vllm serve` (-tp), and the long one it stands for (--tensor-parallel-size)."""
    return {s: next(o for o in a.option_strings if o.startswith("--")) for a in parser()._actions
            for s in a.option_strings if not s.startswith("--") and any(o.startswith("--") for o in a.option_strings)}


def registered(kind):
    manager = _first(("vllm.tool_parsers", "ToolParserManager"),
                     ("vllm.entrypoints.openai.tool_parsers", "ToolParserManager")) if kind == "tool" else \
        _first(("vllm.reasoning", "ReasoningParserManager"))
    if manager is None:
        return None
    names = getattr(manager, "list_registered", None)
    return set(names()) if names else set(getattr(manager, "tool_parsers", getattr(manager, "reasoning_parsers", {})))


def judge(argv):
    p = parser()
    if p is None:
        return 2, "no vLLM serve argument parser in the image (vllm...cli_args.make_arg_parser)"
    try:
        args = p.parse_args(argv)
    except Refused as exc:
        return 1, " ".join(str(exc).split())[:300]
    for flag, dest, kind in (("--tool-call-parser", "tool_call_parser", "tool"),
                             ("--reasoning-parser", "reasoning_parser", "reasoning")):
        name = getattr(args, dest, None)
        if name is None:
            name = getattr(getattr(args, "structured_outputs_config", None), dest, None)
        if not name or (kind == "tool" and getattr(args, "tool_parser_plugin", None)):
            continue  # unset, or a plugin may register it at start
        have = registered(kind)
        if have is not None and name not in have:
            return 1, f"{flag} {name}: the image's vLLM has no such {kind} parser (it has {', '.join(sorted(have))})"
    return 0, f"vLLM accepts the argv ({len(argv)} arguments)"


if __name__ == "__main__":
    code, line = judge(sys.argv[1:])
    print(line)
    sys.exit(code)
