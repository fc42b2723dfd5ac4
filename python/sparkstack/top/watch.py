"""`top`'s reads: /metrics only, never a request; and the recipe's KV pool in tokens."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

from sparkstack.deploy import Deployment
from sparkstack.endpoint.client import Endpoint, EndpointError
from sparkstack.errors import SparkstackError
from sparkstack.text import printable
from sparkstack.top.sample import History

UNREACHABLE = ("connect", "timeout")  # EndpointError kinds where nothing answered


def read(ep: Endpoint, history: History) -> str:
    """One scrape into the history; the state to show ("ok", or why there was nothing to read). A server that
    answers /metrics with an HTTP error or with text that is not Prometheus is reachable: its figures are n/a."""
    try:
        scrape = ep.scrape()
    except EndpointError as exc:
        if exc.kind in UNREACHABLE:
            return f"unreachable: {printable(exc)}"
        return f"{printable(exc)}: every figure is n/a"
    except SparkstackError as exc:  # not Prometheus text
        return f"{ep.url}{printable(exc)}: every figure is n/a"
    if scrape is None:
        return f"{ep.url}/metrics: not found (404): every figure is n/a"
    history.add(scrape)
    return "ok"


def once(ep: Endpoint, interval_s: float) -> tuple[History, str]:
    """Two scrapes `interval_s` apart: rates need two. A server that cannot be reached is one error line; one
    without /metrics, or whose /metrics fails or is not Prometheus text, gives a sample of n/a and its state."""
    history = History()
    state = "ok"
    for i in range(2):
        if i:
            time.sleep(interval_s)
        state = read(ep, history)
        if state.startswith("unreachable"):
            raise SparkstackError(state.removeprefix("unreachable: "))
    return history, state


def follow(ep: Endpoint, interval_s: float) -> Iterator[tuple[History, str]]:
    """A scrape every `interval_s`, forever (the caller stops on Ctrl-C); a failed read is shown, not fatal."""
    history = History()
    while True:
        started = time.monotonic()
        yield history, read(ep, history)
        time.sleep(max(0.0, interval_s - (time.monotonic() - started)))


def kv_pool(deployment: Deployment | None) -> tuple[int | None, str]:
    """The KV pool in tokens that the recipe's pin buys (launch's KV plan), and a note when unknown."""
    if deployment is None:
        return None, "pool: give --recipe"
    from sparkstack.launch.kv import plan_launch_kv
    from sparkstack.launch.plan import plan_launch

    kv = plan_launch_kv(plan_launch(deployment, os.environ))
    return kv.tokens, "" if kv.tokens is not None else "pool: unknown for this recipe (no KV pin or per-token cost)"
