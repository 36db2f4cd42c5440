"""Exporting the audit trail as JSON lines, and checking such an export without the database."""

from __future__ import annotations

import codecs
import contextlib
import json
import re
from collections.abc import Iterable
from typing import IO, Any

from ._audit_trail import AuditProblem, Chains, entries, undamaged
from ._exceptions import UsageError
from ._text import cut, escape_as_json
from .stores import Store
from .stores._audit import AuditEntry

__all__ = ["check_writable", "export", "verify_export"]


def check_writable(out: object) -> None:
    """An export's target must take text, and any text an entry holds: refused before any entry
    is read, not mid-way (a file opened in ASCII or cp1252 failed at its first "é", leaving a
    cut-short export that verifies clean; a closed or read-only one failed as Python's own)."""
    try:
        out.write("")  # type: ignore[attr-defined]
    except (AttributeError, TypeError) as exc:
        raise UsageError(f"export_audit writes text: {type(out).__name__} takes none") from exc
    except ValueError as exc:  # closed, or not open for writing (`io.UnsupportedOperation`)
        raise UsageError(f"export_audit cannot write to {type(out).__name__}: {exc}") from exc
    encoding = getattr(out, "encoding", None)
    if isinstance(encoding, str) and not _unicode(encoding):
        raise UsageError(
            f"export_audit writes any text an entry holds, which {encoding!r} cannot encode: "
            "open the file with encoding='utf-8'"
        )


def _unicode(encoding: str) -> bool:
    """Whether `encoding` encodes every character (a UTF); an unknown name is left to it."""
    with contextlib.suppress(LookupError):
        return codecs.lookup(encoding).name.startswith("utf")
    return True


_SURROGATE = re.compile("[\ud800-\udfff]")
# A JSON escape, read left to right so `\\\\` is one; group 1 the code of an escaped surrogate.
_ESCAPE = re.compile(r"\\(?:u([dD][89a-fA-F][0-9a-fA-F]{2})|.)")


async def export(store: Store, out: IO[str], *, stream: str | None = None) -> int:
    """Write the trail as JSON lines; returns how many entries. Text is written as it is,
    except a lone surrogate, which no encoding of `out` could hold: it is written as its JSON
    escape (`verify_export` reads a high one then a low one so back as two, not as a pair)."""
    count = 0
    async for e in entries(store, stream=stream):
        line = json.dumps(undamaged(e).to_dict(), ensure_ascii=False, separators=(",", ":"))
        try:
            line.encode("utf-8")
        except UnicodeEncodeError:
            line = _SURROGATE.sub(escape_as_json, line)
        out.write(line + "\n")
        count += 1
    return count


def _unjoined(line: str) -> str:
    """`line` with each escaped surrogate written as itself: JSON would read an escaped high
    surrogate then a low one as the one character they encode, not as the two exported."""
    if "\\u" not in line:
        return line
    return _ESCAPE.sub(lambda m: chr(int(m[1], 16)) if m[1] else m[0], line)


def verify_export(lines: Iterable[str]) -> list[AuditProblem]:
    """Check an export (`Runtime.export_audit`, JSON lines) without the database: each stream's
    chain is recomputed from its first entry as `verify` does. A line that is not an entry is
    named with `n = 0` and its line number as `id`. Without the chain heads the store keeps, an
    export cut short at a stream's end, or rewritten whole, cannot be told apart. The export's
    whole text is read line by line too (at each newline: an entry's text may hold other line
    separators); bytes are refused, as a file opened in binary mode gives them."""
    if isinstance(lines, str):
        _not_a_file_name(lines)
        lines = lines.split("\n")
    elif isinstance(lines, bytes | bytearray) or not isinstance(lines, Iterable):
        raise UsageError(_LINES_OF_TEXT.format(type(lines).__name__))
    chains = Chains()
    problems: list[AuditProblem] = []
    for number, line in enumerate(lines, 1):
        if not isinstance(line, str):
            raise UsageError(_LINES_OF_TEXT.format(f"line {number}: {type(line).__name__}"))
        if number == 1:  # a file written as "utf-8-sig" and read as UTF-8 begins with its mark
            line = line.removeprefix("\ufeff")
        if not line.strip():
            continue
        try:
            text = _unjoined(line)
            e = _entry(json.loads(text))
            if text != line and not chains.follows(e):
                # Exported before lone surrogates alone were escaped: an entry holding one had
                # all its non-ASCII text escaped, a character above U+FFFF as a pair.
                joined = _entry(json.loads(line))
                e = joined if chains.follows(joined) else e
            # A forger's line may hold a time no float holds (OverflowError) or nest deeper
            # than JSON is read or written (RecursionError): named like any other, not raised.
            problem = chains.check(e)
        except (ValueError, TypeError, KeyError, OverflowError, RecursionError) as exc:
            reason = f"line {number} is not an audit entry: {exc}"
            problems.append(AuditProblem(id=number, stream="", n=0, reason=reason))
            continue
        if problem is not None:
            problems.append(problem)
    return problems


def _not_a_file_name(text: str) -> None:
    """Refuse text that is no export's but reads as the name of one: a file name passed as the
    text was read as a one-line export, and reported as a line that is not an entry, as if the
    export had been tampered with. An export ends each entry, a JSON object, with a newline, so
    text with no newline that does not begin as an object is not one (nor part of one)."""
    first = text.removeprefix("\ufeff").strip()
    if first and "\n" not in text and not first.startswith("{"):
        raise UsageError(
            f"verify_audit_export takes the export itself, not {cut(first, 80)!r}: to check a "
            "file, open it and pass the file (with open(path, encoding='utf-8') as f: "
            "so.verify_audit_export(f))"
        )


_LINES_OF_TEXT = (
    "verify_audit_export reads lines of text (a file opened as text, a list of lines or the "
    "export's whole text), not {}"
)


def _entry(d: dict[str, Any]) -> AuditEntry:
    """An exported entry read back; a field of the wrong kind is a ValueError or TypeError."""
    ints = {k: d[k] for k in ("id", "n")}
    texts = {k: d[k] for k in ("stream", "type", "hash")}
    if any(isinstance(v, bool) or not isinstance(v, int) for v in ints.values()):
        raise TypeError("id and n must be whole numbers")
    if not all(isinstance(v, str) for v in texts.values()):
        raise TypeError("stream, type and hash must be text")
    seq, prev, at, data = d["seq"], d["prev"], d["at"], d["data"]
    if not (seq is None or (isinstance(seq, int) and not isinstance(seq, bool))):
        raise TypeError("seq must be a whole number or null")
    if not (prev is None or isinstance(prev, str)):
        raise TypeError("prev must be text or null")
    if isinstance(at, bool) or not isinstance(at, (int, float)) or not isinstance(data, dict):
        raise TypeError("at must be a number and data an object")
    return AuditEntry(**ints, **texts, seq=seq, prev=prev, at=float(at), data=data)
