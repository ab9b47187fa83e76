"""Markdown → Slack mrkdwn, and splitting long answers (channels/slack/formatting.py)."""

from __future__ import annotations

import random

import pytest

from channels.slack.formatting import MESSAGE_LIMIT, split_message, to_mrkdwn

FENCE = "```"

# -- to_mrkdwn --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("markdown", "mrkdwn"),
    [
        ("**bold** text", "*bold* text"),
        ("**a** and **b**", "*a* and *b*"),
        ("~~gone~~ here", "~gone~ here"),
        ("see [the docs](https://example.com/a)", "see <https://example.com/a|the docs>"),
        ("# Title", "*Title*"),
        ("### Sub title ###", "*Sub title*"),
        ("1 < 2 & 3 > 2", "1 &lt; 2 &amp; 3 &gt; 2"),
        ("plain words", "plain words"),
        ("** not bold **", "** not bold **"),
    ],
)
def test_prose_conversion(markdown: str, mrkdwn: str) -> None:
    assert to_mrkdwn(markdown) == mrkdwn


def test_link_query_ampersand_escaped() -> None:
    assert to_mrkdwn("[q](https://x.io/s?a=1&b=2)") == "<https://x.io/s?a=1&amp;b=2|q>"


def test_heading_only_at_line_start() -> None:
    assert to_mrkdwn("issue #1 is open") == "issue #1 is open"


def test_blockquote_marker_kept_and_rest_escaped() -> None:
    assert to_mrkdwn("> quoted **text** > more") == "> quoted *text* &gt; more"


def test_inline_code_untouched() -> None:
    text = "run `a **b** <c> & [d](https://e.f)` then **go**"
    assert to_mrkdwn(text) == "run `a **b** <c> & [d](https://e.f)` then *go*"


def test_code_block_untouched() -> None:
    block = "```python\nx = a < b and **c**\n# not a heading\n[l](https://u.v)\n```"
    assert to_mrkdwn(block) == block


def test_text_after_code_block_converted_again() -> None:
    text = "```\n**raw**\n```\n**bold** & done"
    assert to_mrkdwn(text) == "```\n**raw**\n```\n*bold* &amp; done"


def test_multiline_keeps_line_structure() -> None:
    text = "# Head\n\n- item **one**\n- item <two>"
    assert to_mrkdwn(text).split("\n") == ["*Head*", "", "- item *one*", "- item &lt;two&gt;"]


def test_heading_with_inline_code_keeps_its_text() -> None:
    out = to_mrkdwn("# Install `pip` now")
    assert out.replace("*", "") == "Install `pip` now"


# -- split_message ----------------------------------------------------------------------------------


def words(chunks: list[str]) -> list[str]:
    """All words in order, ignoring code fences (which splitting may add)."""
    return [w for w in "\n".join(chunks).split() if not w.startswith(FENCE)]


def test_short_text_one_chunk() -> None:
    assert split_message("hello there") == ["hello there"]
    exact = "x" * MESSAGE_LIMIT
    assert split_message(exact) == [exact]


def test_long_text_chunks_within_limit_and_words_in_order() -> None:
    text = " ".join(f"word{i}" for i in range(3000))
    chunks = split_message(text, limit=500)
    assert len(chunks) > 1
    assert all(len(c) <= 500 for c in chunks)
    assert words(chunks) == text.split()


def test_default_limit_used() -> None:
    text = "\n".join(f"a line of text number {i}" for i in range(1000))
    chunks = split_message(text)
    assert len(chunks) > 1
    assert all(len(c) <= MESSAGE_LIMIT for c in chunks)
    assert words(chunks) == text.split()


def test_prefers_paragraph_boundaries() -> None:
    paragraphs = [" ".join([f"p{i}w"] * 20) for i in range(10)]  # 79 characters each
    chunks = split_message("\n\n".join(paragraphs), limit=250)
    for chunk in chunks:
        # every chunk is made of whole paragraphs
        assert all(part in paragraphs for part in chunk.split("\n\n"))
    assert [p for c in chunks for p in c.split("\n\n")] == paragraphs


def test_prefers_lines_over_words() -> None:
    lines = [f"line {i} " + "x" * 30 for i in range(40)]
    chunks = split_message("\n".join(lines), limit=300)
    assert [line for c in chunks for line in c.split("\n")] == lines


def test_hard_cut_when_no_boundary() -> None:
    text = "y" * 1000
    chunks = split_message(text, limit=100)
    assert all(len(c) <= 100 for c in chunks)
    assert "".join(chunks) == text


def test_code_block_closed_and_reopened() -> None:
    code = "\n".join(f"echo line {i}" for i in range(100))
    text = f"Here is the script:\n\n```bash\n{code}\n```\n\nThat is all."
    chunks = split_message(text, limit=400)
    assert len(chunks) > 2
    for chunk in chunks:
        assert len(chunk) <= 400
        assert chunk.count(FENCE) % 2 == 0, chunk
    assert chunks[0].startswith("Here is the script:")
    assert all(c.startswith(FENCE) for c in chunks[1:])
    assert chunks[-1].endswith("That is all.")
    assert words(chunks) == words([text])


def test_randomised_invariants() -> None:
    """A seeded stand-in for a property test (hypothesis is not installed)."""
    rng = random.Random(1234)
    vocabulary = ["alpha", "beta", "gamma", "delta", "x", "longerword", "**b**", "<i>", "&"]
    for _ in range(200):
        blocks = []
        for _ in range(rng.randint(1, 12)):
            body = " ".join(rng.choice(vocabulary) for _ in range(rng.randint(1, 60)))
            if rng.random() < 0.3:
                lines = "\n".join(body[i:i + 40] for i in range(0, len(body), 40))
                blocks.append(f"{FENCE}\n{lines}\n{FENCE}")
            else:
                blocks.append(body)
        text = "\n\n".join(blocks)
        limit = rng.randint(80, 600)
        chunks = split_message(text, limit=limit)
        assert all(len(c) <= limit for c in chunks), (text, limit)
        assert all(c.count(FENCE) % 2 == 0 for c in chunks), (text, limit)
        assert all(c.strip() for c in chunks)
        assert "".join(words(chunks)) == "".join(words([text]))
