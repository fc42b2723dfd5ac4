
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


BATCH = "--sparkstack-gates"  # `-c ARGV_GATE --sparkstack-gates SPEC`: every gate of a launch from this one process
RESULT = "sparkstack-gates: "  # the batch's one line of results, on a line of its own after whatever else was printed
GATE_TIMEOUT_S = 300


def _python_gate(code, args):
    """In a forked child: CODE as `python3 -c CODE ARGS...` would run it, as a fresh `__main__` module; its exit code."""
    import types

    main = types.ModuleType("__main__")
    sys.modules["__main__"], sys.argv = main, ["-c", *args]
    try:
        exec(compile(code, "<string>", "exec"), main.__dict__)
    except SystemExit as exc:  # as the interpreter ends a script: an int is the code, anything else is printed
        if isinstance(exc.code, int) or exc.code is None:
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException:  # noqa: BLE001 (a gate may raise anything; python3 -c would print it and exit 1)
        traceback.print_exc()
        return 1
    return 0


def _forked(code, args, timeout):
    """(exit code, stdout, stderr) of one python gate, in a child forked from this process: what the parent imported
    (vLLM) is there already, and nothing one gate does (its globals, environment, threads, fds, a crash, os._exit)
    reaches the next. stdout and stderr are captured at the file descriptors, so a C extension's output is too."""
    import os
    import signal
    import tempfile
    import time

    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: never returns into the batch
            status = 1
            try:
                os.dup2(out.fileno(), 1)
                os.dup2(err.fileno(), 2)
                sys.stdout = open(1, "w", closefd=False)  # the fds, whatever sys.stdout was (a test's capture)
                sys.stderr = open(2, "w", closefd=False, errors="backslashreplace")
                status = _python_gate(code, args)
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(status if 0 <= status < 256 else 1)
        deadline = time.monotonic() + timeout
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return 124, _read(out), _read(err) + f"the gate did not end within {timeout} s\n"
            time.sleep(0.02)
        code_ = os.waitstatus_to_exitcode(status)  # a signal: minus its number, as subprocess says it
        return code_, _read(out), _read(err)


def _read(f):
    f.seek(0)
    return f.read().decode("utf-8", "replace")


def run_gate(gate, timeout=GATE_TIMEOUT_S):
    """(exit code, stdout, stderr) of one runtime gate. `python3 -c CODE ARG...` runs in a child forked from this
    process, so vLLM is imported once for all the gates; any other argv runs as a process of its own."""
    if len(gate) >= 3 and gate[0] == "python3" and gate[1] == "-c":
        return _forked(gate[2], gate[3:], timeout)
    try:
        proc = subprocess.run(gate, capture_output=True, timeout=timeout)
    except OSError as exc:
        return 127, "", f"{gate[0]}: {exc.strerror or exc}\n"
    except subprocess.TimeoutExpired:
        return 124, "", f"the gate did not end within {timeout} s\n"
    return proc.returncode, proc.stdout.decode("utf-8", "replace"), proc.stderr.decode("utf-8", "replace")


def judged(argv):
    """judge(), never raising: a parser that exits (`--help` in an argv) or breaks is a refusal, said in one line."""
    try:
        return judge(argv)
    except SystemExit as exc:
        return 1, f"vLLM's parser exited ({exc.code}) on this argv instead of judging it (is -h or --help in it?)"
    except Exception as exc:  # noqa: BLE001 (the image's vLLM is not ours: whatever it raises is its answer)
        return 1, " ".join(f"vLLM's parser failed: {type(exc).__name__}: {exc}".split())[:300]


def batch(spec):
    """{"argvs": [engine argv, ...], "gates": [gate argv, ...]} -> each argv judged, [code, line], and each gate
    run, [code, stdout, stderr], in order. vLLM is imported first, whatever is asked, so every gate meets the same
    process whether or not the argv gates were cached."""
    try:
        __import__("vllm")
    except BaseException:  # noqa: BLE001 (no vLLM: the argv gate says so; each gate shows its own error)
        pass
    return {"argvs": [list(judged(argv)) for argv in spec["argvs"]],
            "gates": [list(run_gate(g)) for g in spec["gates"]]}


if __name__ == "__main__" and sys.argv[1:2] == [BATCH]:
    import os

    results = batch(json.loads(sys.argv[2]))
    sys.stdout.flush()
    sys.stderr.flush()
    os.write(1, ("\n" + RESULT + json.dumps(results) + "\n").encode())  # a line of its own, whatever came before
    os._exit(0)  # nothing after the result (an atexit hook, a crash at teardown) can spoil it
