"""Whether a stream's chunk timing measures its decode, judged against the server's own clock.

A client times chunks as they arrive. When vLLM's API server falls behind its engine, or the server coalesces
chunks (`--stream-interval`), many tokens arrive in one burst and the chunk gaps are no longer token gaps: a
stream that decoded for seconds can arrive within a millisecond and read as 68,000 tok/s. The server's histograms
(metrics.ServerTiming) time the same requests on the engine's clock. Where the two disagree by more than AGREE
either way, or a stream gave too few chunks to time, the chunk figure is not a measurement: bench and soak report
the server's figure instead, or withhold the figure, and say why.
"""

from __future__ import annotations

from collections.abc import Sequence

from sparkstack.endpoint.client import StreamResult
from sparkstack.endpoint.metrics import ServerTiming

AGREE = 2.0  # two clocks over the same decode agree far closer than this; beyond it one of them is not measuring


def _apart(client: float, server: float) -> bool:
    return client * AGREE < server or server * AGREE < client


def one_chunk_streams(results: Sequence[StreamResult]) -> int:
    """Streams of more than one token whose text came in a single chunk: no decode time to measure."""
    return sum(1 for r in results if r.output_tokens > 1 and len(r.token_times_s) < 2)


def decode_doubt(results: Sequence[StreamResult], server: ServerTiming | None) -> str | None:
    """Why the streams' chunk-timed decode is not a measurement; None when it stands."""
    client = sum(r.decode_s or 0.0 for r in results if len(r.token_times_s) >= 2)
    single = one_chunk_streams(results)
    if single:
        return f"{single} of {len(results)} streams came in one chunk"
    if server is None or server.requests != len(results):
        return None  # nothing to hold it against (no histograms, or other requests finished meanwhile)
    if _apart(client, server.decode_s):
        return (f"chunk-timed decode {client:.3f} s against the server's {server.decode_s:.3f} s for the same "
                f"{len(results)} requests")
    return None


def itl_doubt(results: Sequence[StreamResult], server: ServerTiming | None) -> str | None:
    """Why the chunk gaps are not inter-token (engine-step) latencies; None when they stand."""
    gaps = [g for r in results for g in r.itls_s]
    if server is None or server.itl_mean_s is None or not gaps or server.requests != len(results):
        return None
    client = sum(gaps) / len(gaps)
    if _apart(client, server.itl_mean_s):
        return (f"mean chunk gap {client * 1000:.2f} ms against the server's mean inter-token latency "
                f"{server.itl_mean_s * 1000:.2f} ms (chunks coalesced, or sent in bursts)")
    return None
