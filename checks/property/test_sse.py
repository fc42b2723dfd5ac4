"""SSE framing: however the bytes are cut into chunks, the same events come out."""

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from sparkstack.endpoint import sse

payloads = st.lists(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n"), max_size=20),
                    min_size=1, max_size=3).filter(lambda lines: "\n".join(lines) != "[DONE]")


def encode(events: list[list[str]], newline: bytes) -> bytes:
    out = b": a comment the server sends to keep the connection open" + newline
    for lines in events:
        out += b"".join(b"data: " + line.encode() + newline for line in lines) + newline
    return out + b"data: [DONE]" + newline + newline + b"data: after done" + newline + newline


@given(st.lists(payloads, max_size=6), st.sampled_from([b"\n", b"\r\n", b"\r"]), st.data())
@settings(max_examples=1000, deadline=None)
def test_events_survive_any_chunking(events, newline, data):
    raw = encode(events, newline)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=12)))
    chunks = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)])]
    got = list(sse.events(chunks))
    assert got == ["\n".join(lines) for lines in events] + ["[DONE]"]


def test_multi_line_data_joins_with_newline_and_comments_are_skipped():
    raw = b'data: {"a":\ndata: 1}\n\n:keepalive\n\ndata:{"b": 2}\n\n'
    assert [json.loads(e) for e in sse.events([raw])] == [{"a": 1}, {"b": 2}]


def test_a_stream_cut_mid_event_still_delivers_its_data():
    assert list(sse.events([b"data: x\n\ndata: partial"])) == ["x", "partial"]
