"""Text lines of a file, read with a bound on a line's length: the readers of
traces and call logs (JSON Lines, CSV) take their lines from here.

A line longer than `max_line_bytes` is refused once that many bytes are read,
before the rest of it is (a 300 MB line costs no more memory than the bound);
a byte that is not UTF-8 is named by its offset in the file and its line.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, TypeVar

from topasd.model import TopasError

# Far above any real line: a task of 10,000 rounds in each of 40 stages is ~10 MB.
DEFAULT_MAX_LINE_BYTES = 64 * 2**20
BOM = b"\xef\xbb\xbf"  # a UTF-8 byte-order mark: not data


T = TypeVar("T")


class LineError(TopasError):
    """A line is too long or not UTF-8; the message names the file, line and fix."""


def _content(raw: bytes) -> bytes:
    """A line without its ending (`\\n` or `\\r\\n`)."""
    if raw.endswith(b"\n"):
        raw = raw[:-1]
        if raw.endswith(b"\r"):
            raw = raw[:-1]
    return raw


def too_long(where: str, max_line_bytes: int, what: str) -> str:
    """The message for a line longer than the bound."""
    return (f"{where}: line longer than {max_line_bytes} bytes (reading stopped there); "
            f"a {what} line is far shorter, so the file is likely damaged or not a {what}; "
            "if the line is real, raise --max-line-bytes")


def not_utf8(where: str, raw: bytes, start: int, offset: int, what: str) -> str:
    """The message for a byte that is not UTF-8 (`start`: in the line, `offset`: of
    the line in the file)."""
    return (f"{where}: not UTF-8 text (byte 0x{raw[start]:02x} at offset {offset + start} "
            f"of the file, column {start + 1} of the line); a {what} is UTF-8 text")


def text_lines(fh: BinaryIO, name: str, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
               what: str = "trace") -> Iterator[str]:
    """The lines of `fh` decoded from UTF-8, each with its ending (as a text
    file iterates); LineError names `name:LINE` for a line longer than
    `max_line_bytes` (its ending not counted) or a byte that is not UTF-8."""
    if max_line_bytes < 1:
        raise TopasError(f"--max-line-bytes must be at least 1, got {max_line_bytes}")
    offset, lineno = 0, 0
    while True:
        raw = fh.readline(max_line_bytes + 2)  # room for the ending of the longest line
        if not raw:
            return
        lineno += 1
        start = len(BOM) if lineno == 1 and raw.startswith(BOM) else 0
        if len(_content(raw)) - start > max_line_bytes:
            raise LineError(too_long(f"{name}:{lineno}", max_line_bytes, what))
        try:
            yield raw[start:].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise LineError(not_utf8(f"{name}:{lineno}", raw, start + exc.start, offset,
                                     what)) from None
        offset += len(raw)


@contextmanager
def open_lines(path: str | Path, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
               what: str = "trace") -> Iterator[tuple[str, Iterator[str]]]:
    """`(name, lines)` of the file at `path` (`-`: standard input, named
    `<stdin>`), read by `text_lines`; TopasError if it cannot be opened."""
    if str(path) == "-":
        yield "<stdin>", text_lines(sys.stdin.buffer, "<stdin>", max_line_bytes, what)
        return
    try:
        fh = open(path, "rb")  # noqa: SIM115  (closed below)
    except OSError as exc:
        raise TopasError(f"cannot read {what} {path}: {exc.strerror}") from None
    with fh:
        yield str(path), text_lines(fh, str(path), max_line_bytes, what)


def parse_file(path: str | Path, parse: Callable[[Iterator[str], str], T],
               error: type[TopasError], max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
               what: str = "trace") -> T:
    """`parse(lines, name)` of the file at `path` (`open_lines`); every problem
    (a line too long or not UTF-8, a file that cannot be read) as `error`."""
    try:
        with open_lines(path, max_line_bytes, what) as (name, lines):
            return parse(lines, name)
    except error:
        raise
    except TopasError as exc:
        raise error(str(exc)) from None
    except OSError as exc:
        raise error(f"cannot read {what} {path}: {exc.strerror}") from None
