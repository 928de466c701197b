"""Every command block of README.md and docs/*.md runs as written (issue 35).

Each document's shell and Python blocks run in order in a temp directory, against real
``logmq-server`` processes started the way the document says; the convention for what a
document needs and for the few blocks CI cannot run is in tests/docs/doc_runner.py and
docs/testing.md ("Docs whose commands run").
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.docs.doc_runner import (
    DocTestError,
    DocumentRun,
    plan_block,
    plan_document,
    shift_ports,
)
from tests.docs.markdown_blocks import Block, fenced_blocks, heading_anchors

ROOT = Path(__file__).resolve().parents[2]
EXCLUDED = {
    # being rewritten; its recipe runs in tests/docs/test_security_recipe.py
    "docs/security.md",
}
DOCUMENTS = sorted(
    str(p.relative_to(ROOT))
    for p in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
    if str(p.relative_to(ROOT)) not in EXCLUDED
)
# documents with blocks to run or skip (a skip is reported)
RUNNABLE = [
    doc
    for doc in DOCUMENTS
    if any(p.action in ("shell", "python", "skip") for p in plan_document(ROOT / doc))
]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("doc", RUNNABLE)
def test_the_commands_of_the_document_run(doc: str, tmp_path: Path) -> None:
    run = DocumentRun(ROOT / doc, tmp_path, ROOT)
    started = time.monotonic()
    try:
        run.run()
    finally:
        run.close()
    spent = ", ".join(f"line {t.line} {t.seconds:.1f} s" for t in run.timings)
    skips = "; ".join(f"line {line}: {reason}" for line, reason in run.skipped)
    print(f"{doc}: {time.monotonic() - started:.1f} s ({spent}); skipped: {skips or 'none'}")


def test_every_directive_is_understood_and_every_skip_has_a_reason() -> None:
    for doc in DOCUMENTS:
        for plan in plan_document(ROOT / doc):  # raises on a malformed directive
            assert plan.action != "skip" or plan.reason


LINK = re.compile(r"\]\((?P<target>[^)\s]*)#(?P<anchor>[^)\s]+)\)")


def test_links_to_sections_name_headings_that_exist() -> None:
    """A link to `page.md#section` (or `#section`) names a heading of that page: renamed or
    moved sections (benchmarks.md's, for one) must not leave links dangling."""
    broken = []
    for doc in [*DOCUMENTS, *EXCLUDED]:
        path = ROOT / doc
        text = path.read_text(encoding="utf-8")
        for match in LINK.finditer(text):
            target = (path.parent / match["target"]) if match["target"] else path
            if target.suffix != ".md" or not target.is_file():
                continue
            if match["anchor"] not in heading_anchors(target):
                line = text.count("\n", 0, match.start()) + 1
                broken.append(f"{doc}:{line}: {match[0]}")
    assert not broken, "links to missing sections:\n" + "\n".join(broken)


# -- the extractor and the runner's rules, on small inputs ------------------------------


def test_fenced_blocks_give_info_line_text_directives_and_caption(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(
        "# Title\n"
        "\n"
        "```sh\n"
        "echo one\n"
        "```\n"
        "Run this:\n"
        "<!-- doc-test: needs broker -->\n"
        "\n"
        "<!-- doc-test: input: a\\nb -->\n"
        "~~~~python title\n"
        "print('```')\n"
        "~~~~\n"
        "- a list item:\n"
        "\n"
        "  ```text\n"
        "  indented output\n"
        "  ```\n"
        "\n"
        "    indented code is not a fence\n"
        "```\n"
        "unclosed\n"
    )
    blocks = fenced_blocks(doc)
    assert [(b.info, b.line, b.text) for b in blocks] == [
        ("sh", 3, "echo one\n"),
        ("python title", 10, "print('```')\n"),
        ("text", 15, "indented output\n"),
        ("", 20, "unclosed\n"),
    ]
    assert blocks[1].directives == ("needs broker", "input: a\\nb")
    assert blocks[1].caption == "Run this:"
    assert blocks[1].language == "python"
    assert blocks[0].directives == ()
    assert heading_anchors(doc) == {"title"}  # "# not a heading" lines inside fences


def test_heading_anchors_follow_github(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(
        "# logmq.testing start-up (issue 15)\n"
        "## Benchmarks: `logmq bench produce|consume|latency`\n"
        "## Again\n## Again\n"
        "```sh\n# a comment\n```\n"
    )
    assert heading_anchors(doc) == {
        "logmqtesting-start-up-issue-15",
        "benchmarks-logmq-bench-produceconsumelatency",
        "again",
        "again-1",
    }


def test_directives_are_read_and_a_bad_one_is_refused(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"

    def plan(info: str, *directives: str, caption: str = ""):
        return plan_block(doc, Block(info, 1, "x\n", directives, caption))

    assert plan("sh", "needs cluster 4").needs == ("cluster", 4)
    assert plan("python", "input: pw\\npw").stdin == b"pw\npw\n"
    assert plan("sh", "skip: needs an S3 account").reason == "needs an S3 account"
    assert plan("python", caption="`examples/app.py`:").action == "file"
    assert plan("json").action == "none"
    for bad in (("skip:",), ("needs brokers",), ("needs cluster",), ("run twice",)):
        with pytest.raises(DocTestError):
            plan("sh", *bad)
    with pytest.raises(DocTestError):
        plan("text", "needs broker")


def test_example_ports_shift_by_one_offset() -> None:
    text = (
        "logmq --bootstrap 127.0.0.1:9192,127.0.0.1:9193 topic list\n"
        "logmq-server --port 9192 --kafka-port=9092 --quorum-voters 1@127.0.0.1:9292\n"
        "seq 1 9192 | logmq produce t --linger-ms 9000\n"
    )
    assert shift_ports(text, 1000) == (
        "logmq --bootstrap 127.0.0.1:10192,127.0.0.1:10193 topic list\n"
        "logmq-server --port 10192 --kafka-port=10092 --quorum-voters 1@127.0.0.1:10292\n"
        "seq 1 9192 | logmq produce t --linger-ms 9000\n"
    )
