"""core.answer_stream: the live text of a turn is masked before it leaves, held until the masks are
checked, batched, and restarted per model call."""

from __future__ import annotations

import asyncio

from core.answer_stream import AnswerStream
from core.redaction import Redactor


def _redactor(*secrets: str) -> Redactor:
    async def load() -> list[tuple[str, str]]:
        return []

    async def fingerprint() -> str:
        return "none"

    redactor = Redactor(load, fingerprint)
    redactor.add_static([("setting", value) for value in secrets])
    return redactor


async def test_text_waits_for_the_mask_check_even_when_the_model_then_pauses() -> None:
    sent: list[tuple[str, bool]] = []
    checked: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    stream = AnswerStream(lambda text, restart: sent.append((text, restart)), _redactor("hunter2-secret"), checked,
                          batch_s=0.01)
    stream.restart()
    stream("x" * 100)
    await asyncio.sleep(0.05)
    assert sent == []  # the masks are not known to be current yet
    checked.set_result(None)  # and no further piece arrives: the check's end sends what is decided
    await asyncio.sleep(0.05)
    assert sent and sent[0][1] is True and set("".join(t for t, _ in sent)) == {"x"}  # what is decided


async def test_a_secret_split_across_pieces_is_masked_and_never_sent_in_part() -> None:
    sent: list[str] = []
    checked: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    checked.set_result(None)
    stream = AnswerStream(lambda text, _restart: sent.append(text), _redactor("hunter2-secret"), checked, batch_s=0)
    stream.restart()
    for piece in ("the password is hun", "ter2-", "sec", "ret, keep it safe"):
        stream(piece)
        await asyncio.sleep(0.01)
    stream.finish()
    whole = "".join(sent)
    assert "hunter2" not in whole and "hun" not in whole.replace("the password is", "")
    assert whole.startswith("the password is ") and whole.endswith(", keep it safe")


async def test_a_failed_check_sends_nothing() -> None:
    sent: list[str] = []
    checked: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    stream = AnswerStream(lambda text, _restart: sent.append(text), _redactor("s3cr3t-value"), checked, batch_s=0)
    stream.restart()
    stream("y" * 50)
    checked.set_exception(RuntimeError("database unreachable"))
    checked.exception()
    await asyncio.sleep(0.02)
    assert sent == []


async def test_each_model_call_restarts_and_a_retry_drops_what_was_held() -> None:
    sent: list[tuple[str, bool]] = []
    stream = AnswerStream(lambda text, restart: sent.append((text, restart)), None, None, batch_s=10)
    stream.restart()
    stream("first attempt, cut off")
    stream.restart()  # a retry: the batch not yet sent is not this call's text
    stream("second")
    stream.finish()
    assert sent == [("second", True)]
    stream.restart()  # the next step
    stream(" step two")
    stream.finish()
    assert sent[-1] == (" step two", True)


async def test_an_answer_that_comes_whole_before_anything_was_sent_is_not_shown_live() -> None:
    sent: list[str] = []
    stream = AnswerStream(lambda text, _restart: sent.append(text), None, None, batch_s=10)
    stream.restart()
    stream("the whole answer at once")
    stream.finish(final=True)
    assert sent == []  # delivered at once anyway: no live copy
    stream = AnswerStream(lambda text, _restart: sent.append(text), None, None, batch_s=10)
    stream.restart()
    stream("let me look")
    stream.finish()  # a step with tool calls: its text shows
    stream.restart()
    stream("found it")
    stream.finish(final=True)
    assert sent == ["let me look", "found it"]
