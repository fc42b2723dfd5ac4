"""recipe/engine_flags.py: the recorded `vllm serve` flag set, read as vLLM's parser reads a flag. Which
spellings the real vLLM takes is settled against the real parser in checks/engine/test_vllm_argv.py; these
pin the words of each refusal and the spelling rules on a small hand-made flag set."""

import pytest

from sparkstack.recipe.engine_flags import ServeFlags, serve_flags

SMALL = ServeFlags("9.9.9", {"--max-num-seqs": "value", "--max-num-batched-tokens": "value", "--enforce-eager": "switch",
                             "--kv-cache-memory-bytes": "value", "--compilation-config": "value", "--api-key": "value",
                             "--api-server-count": "value", "--lora-path": "optional", "--quantization": "value",
                             "--tensor-parallel-size": "value", "--optimization-level": "value"},
                   {"-q": "--quantization", "-cc": "--compilation-config", "-tp": "--tensor-parallel-size", "-asc": "--api-server-count"})


@pytest.mark.parametrize("arg, option", [
    ("--max-num-seqs", "--max-num-seqs"),
    ("--max_num_seqs", "--max-num-seqs"),  # `_` for `-`, as FlexibleArgumentParser rewrites it
    ("--max-num-seqs=6", "--max-num-seqs"),
    ("--max_num_seqs=a_b", "--max-num-seqs"),
    ("--kv-cache-memory", "--kv-cache-memory-bytes"),  # argparse's unique prefix
    ("--compilation-config.mode", "--compilation-config"),  # a dict flag's key
    ("--compilation_config.cudagraph_mode", "--compilation-config"),  # `_` only before the first `.`
    ("--max-num", None),  # two flags begin so
    ("--api", None),
    ("--max-num-seqz", None),
    ("--enforce-eagerly", None),
    ("-tp", "--tensor-parallel-size"),  # a short option string
    ("-tp=2", "--tensor-parallel-size"),
    ("-qfp8", "--quantization"),  # a one-letter short option with its value attached
    ("-t", "--tensor-parallel-size"),  # argparse's unique prefix, among the short ones
    ("-a", "--api-server-count"),
    ("-O3", "--optimization-level"),  # vLLM's own rewrite of -O
    ("-cc.mode", "--compilation-config"),  # a dict flag's key, after its short form
    ("-tp2", None),  # -t is no option, so nothing takes the 2
    ("-x", None),
])
def test_option_of_reads_a_flag_as_the_parser_does(arg, option):
    assert SMALL.option_of(arg) == option


@pytest.mark.parametrize("arg, takes", [
    ("--max-num-seqs", True), ("--max-num-seqs=6", False), ("--enforce-eager", False),
    ("--compilation-config.mode", True), ("--lora-path", False), ("--nope", False),
    ("-tp", True), ("-tp=2", False), ("-qfp8", False), ("-O3", False),
])
def test_takes_value(arg, takes):
    """A dict key's value follows it; `=` carries its own; an optional value is not taken blindly."""
    assert SMALL.takes_value(arg) is takes


@pytest.mark.parametrize("arg, spelled", [
    ("-tp", "--tensor-parallel-size"), ("-tp=2", "--tensor-parallel-size=2"), ("-qfp8", "--quantization=fp8"),
    ("-O3", "--optimization-level=3"), ("-O=2", "--optimization-level=2"), ("-x", "-x"),
    ("-cc.mode=3", "--compilation-config.mode=3"),
])
def test_a_short_flag_is_spelled_out_as_its_long_one(arg, spelled):
    """So a knob finds `-tp 2` as its twin, and the image's gate reads the argv as the dry run did."""
    assert SMALL.spelled_out(arg) == spelled


def test_an_unknown_short_flag_names_the_short_ones_it_might_be():
    assert SMALL.problem("-tq") == ("-tq is not a flag of vLLM 9.9.9's `vllm serve` (its short flags beginning -t: "
                                    "-tp; or spell the flag out)")
    assert "vllm serve --help" in SMALL.problem("-x")


def test_a_typo_names_the_nearest_flag_and_the_version():
    assert SMALL.problem("--max-num-seqz") == "--max-num-seqz is not a flag of vLLM 9.9.9's `vllm serve` (nearest: --max-num-seqs)"
    assert SMALL.problem("--max_num_seqz=4") == ("--max-num-seqz is not a flag of vLLM 9.9.9's `vllm serve` "
                                                  "(nearest: --max-num-seqs)")


def test_nothing_near_points_to_the_help():
    assert SMALL.problem("--zzzz") == "--zzzz is not a flag of vLLM 9.9.9's `vllm serve` (`vllm serve --help` lists them)"


def test_an_ambiguous_prefix_lists_what_it_begins():
    assert SMALL.problem("--api") == ("--api is ambiguous to vLLM 9.9.9's `vllm serve`: it begins --api-key, "
                                      "--api-server-count; spell the flag out")


def test_a_hostile_flag_is_one_short_printable_line():
    why = SMALL.problem("--x\x1b[2J" + "y" * 500)
    assert "\x1b" not in why and "\n" not in why and len(why) < 200


def test_every_flag_a_taken_flag_problem_is_none():
    assert all(SMALL.problem(f) is None for f in SMALL.kinds)


def test_the_recorded_set_is_the_pinned_vllms():
    flags = serve_flags()
    assert flags.vllm == "0.32.0"  # FACTS: the image's vLLM
    # the flags the shipped recipes and the blog's launcher pass, and the kind each is
    for switch in ("--enable-auto-tool-choice", "--enforce-eager", "--trust-remote-code"):
        assert flags.kinds[switch] == "switch", switch
    for value in ("--max-model-len", "--max-num-seqs", "--kv-cache-memory-bytes", "--speculative-config",
                  "--tensor-parallel-size", "--tool-call-parser", "--reasoning-parser", "--moe-backend"):
        assert flags.kinds[value] == "value", value
    assert flags.problem("--max-num-seqz").endswith("(nearest: --max-num-seqs)")
