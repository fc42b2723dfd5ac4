"""The fixed, versioned prompt suite (suite-v1.json, package data), turned into request bodies.

Every body's first message starts with a salt unique to the run and the request, so that vLLM's prefix cache
cannot serve a repeat from cache and flatter the figures.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources

from sparkstack.errors import UsageError

SUITE_FILE = "suite-v1.json"


@dataclass(frozen=True)
class Suite:
    version: str
    prompts: dict[str, tuple[str, ...]]  # category -> prompts, in file order
    tools: tuple[dict, ...]              # offered (tool_choice "auto") with the tool-args category

    @property
    def categories(self) -> tuple[str, ...]:
        return tuple(self.prompts)

    def check_categories(self, names: tuple[str, ...] | list[str]) -> tuple[str, ...]:
        unknown = [n for n in names if n not in self.prompts]
        if unknown:
            raise UsageError(f"unknown category {unknown[0]!r}; the suite has: {', '.join(self.prompts)}")
        return tuple(dict.fromkeys(names)) or self.categories

    def body(self, category: str, index: int, salt: str, *, model: str, max_tokens: int, temperature: float,
             top_p: float) -> dict:
        """The request for the index-th request of a category (prompts cycle), salted with `salt`."""
        prompts = self.prompts[category]
        text = f"[{salt}] {prompts[index % len(prompts)]}"
        body = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
                "temperature": temperature, "top_p": top_p, "stream_options": {"include_usage": True}}
        if category == "tool-args":
            body |= {"tools": list(self.tools), "tool_choice": "auto"}
        return body


def load() -> Suite:
    doc = json.loads(resources.files(__package__).joinpath(SUITE_FILE).read_text(encoding="utf-8"))
    return Suite(doc["version"], {k: tuple(v) for k, v in doc["categories"].items()}, tuple(doc["tools"]))
