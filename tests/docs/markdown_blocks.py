"""The fenced code blocks of a markdown file, for tests that run what the docs say.

Fences are CommonMark's: three or more backticks or tildes, closed by a line of the same
character at least as long; a fence may be indented (inside a list item), and its
content loses that indentation. Each block keeps its info string (``sh``, ``python``,
or empty for an output sample) and the heading it sits under.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

_FENCE = re.compile(r"^(?P<indent>[ ]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
_HEADING = re.compile(r"^#{1,6}[ \t]+(?P<title>.*?)[ \t]*#*[ \t]*$")


@dataclass(frozen=True, slots=True)
class Block:
    info: str  # the info string's first word ("sh", "python", "" ...)
    text: str  # the content, without the fence's indentation
    line: int  # the opening fence's line number (1-based)
    section: str  # the nearest heading above the block


def fenced_blocks(path: str | os.PathLike[str]) -> list[Block]:
    """Every fenced block of the markdown file at ``path``, in order."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    out: list[Block] = []
    section = ""
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            heading = _HEADING.match(lines[i])
            if heading is not None:
                section = heading["title"]
            i += 1
            continue
        indent, fence = len(opening["indent"]), opening["fence"]
        info = opening["info"].split()[0] if opening["info"].split() else ""
        closing = re.compile(rf"^[ ]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not closing.match(lines[j]):
            line = lines[j]
            strip = min(indent, len(line) - len(line.lstrip(" ")))
            body.append(line[strip:])
            j += 1
        out.append(Block(info, "\n".join(body) + "\n" if body else "", i + 1, section))
        i = j + 1
    return out
