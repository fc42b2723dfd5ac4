"""What a bench run will do, as frozen data: the settings, and one block per (concurrency, category).

A block runs `rounds` rounds; a round is `concurrency` streamed requests sent at once, each with its own salt.
Making a plan reads only the packaged suite: no request is sent (`--dry-run` prints exactly this).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from sparkstack.bench import suite as suite_mod
from sparkstack.endpoint.client import base_url
from sparkstack.errors import UsageError

DEFAULT_CONCURRENCY = (1, 2, 3, 4, 5, 6)
DEFAULT_ROUNDS = 3
DEFAULT_MAX_TOKENS = 512
DEFAULT_TEMPERATURE = 1.0  # the model's own sampling defaults (top-p 0.95): temperature 0 flatters acceptance
DEFAULT_TOP_P = 0.95


@dataclass(frozen=True)
class Settings:
    url: str
    model: str | None  # None: the server's first model, asked at run time
    concurrency: tuple[int, ...]
    rounds: int
    max_tokens: int
    temperature: float
    top_p: float
    categories: tuple[str, ...]

    def to_json(self) -> dict:
        return {"url": self.url, "model": self.model, "concurrency": list(self.concurrency), "rounds": self.rounds,
                "max_tokens": self.max_tokens, "temperature": self.temperature, "top_p": self.top_p,
                "categories": list(self.categories)}


@dataclass(frozen=True)
class Block:
    concurrency: int
    category: str
    rounds: int

    @property
    def requests(self) -> int:
        return self.concurrency * self.rounds

    @property
    def name(self) -> str:
        return f"c={self.concurrency} {self.category}"


@dataclass(frozen=True)
class BenchPlan:
    suite: suite_mod.Suite
    settings: Settings
    blocks: tuple[Block, ...]
    salt: str  # this run's part of every prompt's salt

    @property
    def requests(self) -> int:
        """Requests the blocks send when none is rerun (a noisy block runs once more)."""
        return sum(b.requests for b in self.blocks)

    def request_salt(self, block: Block, attempt: int, round_no: int, stream: int) -> str:
        return f"{self.salt}-{block.concurrency}-{block.category}-{attempt}-{round_no}-{stream}"

    def body(self, block: Block, attempt: int, round_no: int, stream: int) -> dict:
        s = self.settings
        salt = self.request_salt(block, attempt, round_no, stream)
        body = self.suite.body(block.category, round_no * block.concurrency + stream, salt, model=s.model or "",
                               max_tokens=s.max_tokens, temperature=s.temperature, top_p=s.top_p)
        return body | {"logprobs": True}  # each sampled token's logprob: the sampling-integrity count

    def to_json(self) -> dict:
        return {"suite_version": self.suite.version, "settings": self.settings.to_json(), "salt": self.salt,
                "blocks": [{"concurrency": b.concurrency, "category": b.category, "rounds": b.rounds,
                            "requests": b.requests} for b in self.blocks],
                "requests": self.requests}


def plan_bench(url: str, *, concurrency: tuple[int, ...] = DEFAULT_CONCURRENCY, rounds: int = DEFAULT_ROUNDS,
              max_tokens: int = DEFAULT_MAX_TOKENS, temperature: float = DEFAULT_TEMPERATURE,
              top_p: float = DEFAULT_TOP_P, categories: tuple[str, ...] = (), model: str | None = None) -> BenchPlan:
    suite = suite_mod.load()
    if model is not None and not model.strip():
        raise UsageError("--model must not be empty")
    if not concurrency or any(c < 1 for c in concurrency):
        raise UsageError("--concurrency takes whole numbers of at least 1, e.g. 1,2,4")
    if rounds < 1 or max_tokens < 1:
        raise UsageError("--rounds and --max-tokens must be at least 1")
    if not 0 < top_p <= 1:
        raise UsageError(f"--top-p {top_p:g}: must be in (0, 1]")
    cats = suite.check_categories(tuple(categories))
    settings = Settings(base_url(url), model, tuple(dict.fromkeys(concurrency)), rounds, max_tokens, temperature,
                        top_p, cats)
    blocks = tuple(Block(c, cat, rounds) for c in settings.concurrency for cat in cats)
    return BenchPlan(suite, settings, blocks, secrets.token_hex(4))
