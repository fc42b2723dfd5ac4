
import contextlib
import io
import json
import subprocess
import sys
import traceback


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


BATCH = "--sparkstack-gates"  # `-c ARGV_GATE --sparkstack-gates SPEC`: every gate of a launch in this one process
RESULT = "sparkstack-gates: "  # the batch's one line of results, after whatever the gates printed


def run_gate(gate):
    """(exit code, stdout, stderr) of one runtime gate. `python3 -c CODE ARG...` runs in this interpreter, as a
    fresh `__main__`, so vLLM is imported once for all the gates; any other argv runs as a process of its own."""
    if len(gate) < 3 or gate[0] not in ("python3", "python") or gate[1] != "-c":
        try:
            proc = subprocess.run(gate, capture_output=True, text=True)
        except OSError as exc:
            return 127, "", f"{gate[0]}: {exc.strerror or exc}\n"
        return proc.returncode, proc.stdout, proc.stderr
    out, err, code, argv = io.StringIO(), io.StringIO(), 0, sys.argv
    sys.argv = ["-c", *gate[3:]]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            exec(compile(gate[2], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    except SystemExit as exc:  # as the interpreter ends a script: an int is the code, anything else is printed
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, (int, type(None))):
            err.write(f"{exc.code}\n")
    except BaseException:  # noqa: BLE001 (a gate may raise anything; python3 -c would print it and exit 1)
        code = 1
        err.write(traceback.format_exc())
    finally:
        sys.argv = argv
    return code, out.getvalue(), err.getvalue()


def batch(spec):
    """{"argvs": [engine argv, ...], "gates": [gate argv, ...]} -> each argv judged, [code, line], and each gate
    run, [code, stdout, stderr], in order."""
    return {"argvs": [list(judge(argv)) for argv in spec["argvs"]], "gates": [list(run_gate(g)) for g in spec["gates"]]}


if __name__ == "__main__" and sys.argv[1:2] == [BATCH]:
    results = batch(json.loads(sys.argv[2]))
    sys.stdout.flush()
    print(RESULT + json.dumps(results))
