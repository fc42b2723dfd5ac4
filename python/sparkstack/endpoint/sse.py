"""Server-sent events, read the way the WHATWG spec says: lines end in \\r\\n, \\n or \\r (also across chunk
boundaries), `data:` lines of one event join with \\n, `:` lines are comments, a blank line ends an event."""

from collections.abc import Iterable, Iterator

DONE = "[DONE]"


def split_lines(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """Whole lines from arbitrarily cut chunks, without their terminators."""
    buf = b""
    pending_cr = False  # a chunk ended in \r: a \n starting the next one belongs to the same terminator
    for chunk in chunks:
        if not chunk:  # an empty read must not forget a pending \r
            continue
        if pending_cr and chunk.startswith(b"\n"):
            chunk = chunk[1:]
        pending_cr = False
        buf += chunk
        while True:
            cut = min((i for i in (buf.find(b"\r"), buf.find(b"\n")) if i >= 0), default=-1)
            if cut < 0:
                break
            line, term = buf[:cut], buf[cut:cut + 1]
            buf = buf[cut + 1:]
            if term == b"\r":
                if buf.startswith(b"\n"):
                    buf = buf[1:]
                elif not buf:
                    pending_cr = True
            yield line
    if buf:
        yield buf


def events(chunks: Iterable[bytes]) -> Iterator[str]:
    """The data of each event; stops after the data `[DONE]`. Events without data (comments, retry) are skipped."""
    data: list[str] = []
    for raw in split_lines(chunks):
        line = raw.decode("utf-8", errors="replace")
        if line == "":
            if data:
                text = "\n".join(data)
                data = []
                yield text
                if text == DONE:
                    return
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "data":
            data.append(value)
    if data:  # a stream cut without its final blank line still delivers what it sent
        yield "\n".join(data)
