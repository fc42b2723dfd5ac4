"""Server-sent events, read the way the WHATWG spec says: lines end in \\r\\n, \\n or \\r (also across chunk
boundaries), `data:` lines of one event join with \\n, `:` lines are comments, a blank line ends an event.

Linear in the bytes read, and bounded: a line or an event longer than MAX_LINE is refused, not buffered."""

import re
from collections.abc import Iterable, Iterator

DONE = "[DONE]"
MAX_LINE = 4 << 20  # a chat chunk is a few KiB; a huge tool-call argument stays far below this
_TERMINATOR = re.compile(rb"\r\n|\r|\n")


class LineTooLong(ValueError):
    pass


def split_lines(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """Whole lines from arbitrarily cut chunks, without their terminators."""
    buf = bytearray()  # holds no terminator between chunks: scanning resumes where the last chunk ended
    pending_cr = False  # the previous chunk ended in \r: a \n starting this one belongs to the same terminator
    for chunk in chunks:
        if not chunk:  # an empty read must not forget a pending \r
            continue
        if pending_cr and chunk.startswith(b"\n"):
            chunk = chunk[1:]
        scan_from = len(buf)
        buf += chunk
        pos = 0
        for m in _TERMINATOR.finditer(buf, scan_from):
            yield bytes(buf[pos:m.start()])
            pos = m.end()
        pending_cr = pos == len(buf) and buf.endswith(b"\r")
        del buf[:pos]
        if len(buf) > MAX_LINE:
            raise LineTooLong(f"the stream sent a line of over {MAX_LINE >> 20} MiB")
    if buf:
        yield bytes(buf)


def events(chunks: Iterable[bytes]) -> Iterator[str]:
    """The data of each event; stops after the data `[DONE]`. Events without data (comments, retry) are skipped."""
    data: list[str] = []
    size = 0
    for raw in split_lines(chunks):
        line = raw.decode("utf-8", errors="replace")
        if line == "":
            if data:
                text = "\n".join(data)
                data, size = [], 0
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
            size += len(value)
            if size > MAX_LINE:
                raise LineTooLong(f"the stream sent an event of over {MAX_LINE >> 20} MiB")
    if data:  # a stream cut without its final blank line still delivers what it sent
        yield "\n".join(data)
