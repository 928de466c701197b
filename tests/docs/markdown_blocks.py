"""Fenced code blocks of a markdown file, with what the docs test needs to know about each.

CommonMark's rules, as far as our docs use them: a fence is three or more backticks or
tildes (indented or not: fences inside list items count), the info string follows it, and
the block ends at a line of the same character, at least as long, and nothing else (or at
the end of the file). Indented code blocks are not fences: the docs keep those for
layouts and listings, never for commands.

``heading_anchors(path)`` gives the anchors GitHub makes of the file's headings, so links
to sections can be checked.

Each block also carries the ``<!-- doc-test: ... -->`` comments written on the lines just
above it (blank lines may separate them) and its caption: the nearest non-blank line
above those, which for a file shown in full is "`path/to/file`:".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+(?P<title>.*?)[ \t]*#*[ \t]*$")
DIRECTIVE = re.compile(r"^\s*<!--\s*doc-test:\s*(?P<text>.*?)\s*-->\s*$")


@dataclass(frozen=True, slots=True)
class Block:
    info: str  # the whole info string ("sh", "python", "" ...)
    line: int  # 1-based line number of the opening fence
    text: str  # the content, the fence's indentation removed, ending in a newline
    directives: tuple[str, ...] = ()  # the doc-test comments above it, in order
    caption: str = ""  # the nearest prose line above the block (and its directives)
    section: str = ""  # the title of the heading it sits under

    @property
    def language(self) -> str:
        """The info string's first word, lower case: what the block is written in."""
        return self.info.split()[0].lower() if self.info.split() else ""


def fenced_blocks(path: str | Path) -> list[Block]:
    """Every fenced block of the markdown file at ``path``, in order."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    section = ""
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        # a backtick fence's info string may not contain a backtick (that is inline code)
        if not opening or (opening["fence"][0] == "`" and "`" in opening["info"]):
            heading = HEADING.match(lines[i])
            if heading:
                section = heading["title"]
            i += 1
            continue
        fence, indent = opening["fence"], len(opening["indent"])
        closing = re.compile(rf"^ *{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not closing.match(lines[j]):
            body.append(_dedent(lines[j], indent))
            j += 1
        directives, caption = _above(lines, i)
        blocks.append(
            Block(
                info=opening["info"].strip(),
                line=i + 1,
                text="".join(f"{line}\n" for line in body),
                directives=directives,
                caption=caption,
                section=section,
            )
        )
        i = j + 1
    return blocks


def _dedent(line: str, indent: int) -> str:
    """Remove up to ``indent`` leading spaces, as CommonMark does inside an indented fence."""
    stripped = len(line) - len(line.lstrip(" "))
    return line[min(indent, stripped) :]


def _above(lines: list[str], fence_index: int) -> tuple[tuple[str, ...], str]:
    """The doc-test directives right above a fence (top to bottom), and the caption."""
    directives: list[str] = []
    k = fence_index - 1
    while k >= 0:
        text = lines[k].strip()
        match = DIRECTIVE.match(text)
        if match:
            directives.append(match["text"])
        elif text:
            break
        k -= 1
    caption = lines[k].strip() if k >= 0 else ""
    return tuple(reversed(directives)), caption


def heading_anchors(path: str | Path) -> set[str]:
    """The anchors GitHub gives the headings of the file (outside fences): lower case,
    punctuation dropped, spaces to hyphens, a repeated one suffixed -1, -2, ..."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    fenced = {line for block in fenced_blocks(path) for line in _fence_span(block, lines)}
    anchors: set[str] = set()
    for number, line in enumerate(lines, 1):
        heading = re.match(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not heading or number in fenced:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading[1].strip().lower()).replace(" ", "-")
        anchor, n = slug, 0
        while anchor in anchors:
            n += 1
            anchor = f"{slug}-{n}"
        anchors.add(anchor)
    return anchors


def _fence_span(block: Block, lines: list[str]) -> range:
    """Line numbers (1-based) from a block's opening fence to its closing one."""
    return range(block.line, block.line + block.text.count("\n") + 2)
