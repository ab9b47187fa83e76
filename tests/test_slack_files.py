"""Files shared with a mention (issue 15): images reach the model as image inputs and text files as text,
fetched with the bot token from Slack's file host only and only when the turn takes the message (never
before the ack); anything else is named; the person is told plainly what could not be read."""

from __future__ import annotations

import base64
from typing import Any

from tests.conftest import GatewayClient
from tests.fakes.llm import FakeLLM, Reply
from tests.fakes.slack_api import FakeSlack
from tests.slack_requests import mention

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDR" + b"\x00" * 40


def _with_files(text: str, files: list[dict[str, Any]]) -> dict[str, Any]:
    event = mention(text)
    event["files"] = files
    return event


def _user_content(fake_llm: FakeLLM) -> list[dict[str, Any]] | str:
    content: list[dict[str, Any]] | str = fake_llm.requests[0]["messages"][-1]["content"]
    return content


def _user_text(fake_llm: FakeLLM) -> str:
    """The text parts of the model's last user message."""
    content = _user_content(fake_llm)
    return content if isinstance(content, str) else "\n".join(p.get("text", "") for p in content)


def _notices(fake_slack: FakeSlack) -> list[str]:
    texts = [str(c.params.get("text")) for c in fake_slack.posts()]
    return [text for text in texts if ":information_source:" in text]


async def test_an_image_and_a_text_file_reach_the_model(
        gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM) -> None:
    files = [fake_slack.share("F1", PNG, name="graph.png", mimetype="image/png"),
             fake_slack.share("F2", b"ERROR db timeout\nWARN retrying\n", name="app.log", mimetype="text/plain")]
    fake_llm.then(Reply("The graph shows a spike; the log says the database timed out."))
    await gateway.send_event(_with_files("what happened?", files))
    await fake_slack.wait_for("chat.postMessage")
    await gateway.idle()
    content = _user_content(fake_llm)
    assert isinstance(content, list)
    texts = "\n".join(p["text"] for p in content if p["type"] == "text")
    images = [p["image_url"]["url"] for p in content if p["type"] == "image_url"]
    assert "what happened?" in texts and "ERROR db timeout" in texts and "app.log" in texts
    assert "file 'graph.png' ('image/png') was shared; the image is attached" in texts
    assert images == [f"data:image/png;base64,{base64.b64encode(PNG).decode()}"]
    assert {f for f, _ in fake_slack.downloads} == {"F1", "F2"}
    assert all(auth == "Bearer xoxb-test-token-123456" for _, auth in fake_slack.downloads)
    assert _notices(fake_slack) == []
    # The text file stays in the conversation: the next question sees it without fetching it again.
    fake_llm.then(Reply("It was the database."))
    await gateway.send_event(mention("and the cause?", thread_ts=fake_slack.posts()[0].params["thread_ts"]))
    await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()
    history = "\n".join(str(m.get("content")) for m in fake_llm.requests[1]["messages"])
    assert "ERROR db timeout" in history and len(fake_slack.downloads) == 2


async def test_what_cannot_be_read_is_said_plainly_and_named_to_the_model(
        make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM) -> None:
    gateway: GatewayClient = await start_gateway(make_settings(image_max_bytes=1_000))
    files = [fake_slack.share("F1", PNG + b"\x00" * 2_000, name="huge.png", mimetype="image/png"),
             fake_slack.share("F2", b"%PDF-1.7 ...", name="report.pdf", mimetype="application/pdf"),
             fake_slack.share("F3", b"not an image at all", name="fake.png", mimetype="image/png"),
             fake_slack.share("F4", b"\xff\xfe\x00b\x00a\x00d", name="utf16.txt", mimetype="text/plain")]
    fake_llm.then(Reply("I could only see some of that."))
    await gateway.send_event(_with_files("look at these", files))
    await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()
    [notice] = _notices(fake_slack)
    assert "`huge.png`: it is 2 KB, over the 1 KB limit for images" in notice
    assert "`fake.png`: its content is not a png, jpeg, gif or webp image" in notice
    assert "`utf16.txt`: its content is not UTF-8 text" in notice
    assert "report.pdf" not in notice  # not read, and nothing went wrong: the model is told its name
    text = _user_text(fake_llm)
    assert "'report.pdf' ('application/pdf') was shared; it is not an image or a text file" in text
    assert "could not be read" in text
    assert {f for f, _ in fake_slack.downloads} == {"F3", "F4"}  # neither the big one nor the PDF was fetched


async def test_the_bot_token_never_leaves_slacks_file_host(
        gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM) -> None:
    def entry(file_id: str, url: object, **more: object) -> dict[str, Any]:
        return {"id": file_id, "name": f"{file_id}.txt", "mimetype": "text/plain", "size": 10,
                "url_private_download": url, **more}

    on_slack = [
        entry("FX1", "https://evil.example/files-pri/T1-FX1/a.txt"),
        entry("FX2", "http://127.0.0.1:9/files/FX2"),
        entry("FX3", f"{fake_slack.url.replace('http://', 'http://user:pw@')}/files/FX3"),
        fake_slack.share("FREDIRECT", b"", name="d.txt", mimetype="text/plain"),
        entry("FX5", f"{fake_slack.url}/api/conversations.history?channel=CPRIVATE&f=FX5"),  # the Web API itself
        entry("FX6", "https://files.slack.com.evil.example/files-pri/T1-FX6/f.txt"),
    ]
    withheld = [
        entry("FX7", 42),
        entry("FX8", f"{fake_slack.url}/files/F1"),  # another file's URL
        entry("FX9", f"{fake_slack.url}/files/FX9", is_external=True),  # a remote file: its URL is anyone's
        entry("FX10", f"{fake_slack.url}/files/FX10", file_access="check_file_info"),
    ]
    hostile = on_slack + withheld
    fake_llm.then(Reply("nothing to read"))
    await gateway.send_event(_with_files("read these", hostile))
    await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()
    assert [f for f, _ in fake_slack.downloads] == ["FREDIRECT"]  # the redirect itself is not followed
    [notice] = _notices(fake_slack)
    assert notice.count("it is not on Slack's file host") == len(on_slack)
    assert notice.count("Slack did not share its content with the bot") == len(withheld)


async def test_a_workspace_without_files_read_is_named_as_the_cause(
        gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM) -> None:
    fake_slack.files_readable = False
    files = [fake_slack.share("F1", b"hello", name="notes.txt", mimetype="text/plain")]
    fake_llm.then(Reply("ok"))
    await gateway.send_event(_with_files("read it", files))
    await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()
    [notice] = _notices(fake_slack)
    assert "`notes.txt`: Slack did not hand it over (the app may lack the files:read scope)" in notice


async def test_a_file_bigger_than_it_says_is_refused_not_cut_short(
        gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM) -> None:
    fake_slack.chunked_files = True  # no Content-Length: the size shows only while it is read
    files = [fake_slack.share("F1", b"x" * 300_000 + b"END", name="big.log", mimetype="text/plain", size=10)]
    fake_llm.then(Reply("ok"))
    await gateway.send_event(_with_files("read it", files))
    await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()
    [notice] = _notices(fake_slack)
    assert "`big.log`: it is over the 100 KB limit for text files" in notice
    text = _user_text(fake_llm)
    assert "xxxxxxxxxx" not in text  # nothing of it reached the model


async def test_the_text_of_one_message_s_files_is_capped(
        gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM) -> None:
    files = [fake_slack.share(f"F{n}", b"line of a log\n" * 7_000, name=f"part{n}.log", mimetype="text/plain")
             for n in range(1, 4)]  # 98 KB each, under the per-file limit; 294 KB together
    fake_llm.then(Reply("ok"))
    await gateway.send_event(_with_files("read them", files))
    await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()
    text = _user_text(fake_llm)
    assert 40_000 < len(text) < 42_000 and "[…cut here]" in text
    [notice] = _notices(fake_slack)
    assert "I read only the first" in notice and "`part3.log`: the files of one message are read up to" in notice
