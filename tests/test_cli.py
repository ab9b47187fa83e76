"""The ``bot`` command line: help for every command, one error style, one exit code per kind."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from bot.cli import EXIT_CODES, build_parser, main, masked
from tests.bot_process import run_command

COMMANDS_GUIDE = Path(__file__).resolve().parent.parent / "docs" / "operations.md"  # the `bot` command


@pytest.fixture(autouse=True)
def _process_database(database_url: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """With TEST_DATABASE_URL, the commands run against this test's fresh PostgreSQL database."""
    if database_url:
        monkeypatch.setenv("BOT_PROCESS_DATABASE_URL", database_url)


async def bot(cwd: Path, *args: str, env: dict[str, str] | None = None, process: bool = False) -> tuple[int, str, str]:
    """Run ``bot`` as a user would (in this process unless ``process``: tests/cli_in_process.py): exit code,
    stdout, stderr."""
    finished = await run_command(cwd, env or {}, *args, process=process)
    return finished.code, finished.out, finished.err


def commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...],
                                                                                         argparse.ArgumentParser]]:
    """Every command and verb under ``parser``, with its own parser."""
    found = [(path, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                found += commands(child, (*path, name))
    return found


def test_every_command_and_argument_says_what_it_is_for() -> None:
    every = commands(build_parser())
    assert len(every) > 20  # run, doctor, ... and each verb of approvals, credentials, schedules, web
    for path, parser in every:
        assert parser.description, f"`bot {' '.join(path)} --help` has no description"
        for action in parser._actions:
            assert action.help, f"`bot {' '.join(path)}`: {action.dest} has no help text"
            if isinstance(action, argparse._SubParsersAction):
                listed = {choice.dest for choice in action._choices_actions}
                assert listed == set(action.choices), f"`bot {' '.join(path)}` lists commands without a summary"


def test_help_is_printed_for_a_command_and_mode_states_its_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["manifest", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "Print the Slack app manifest" in out
    assert "(default: http)" in " ".join(out.split())


def test_bot_help_lists_the_exit_codes_and_the_readme_shows_the_same(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for code, kind in (("0", "done"), ("1", "failed"), ("2", "usage"), ("3", "not found"), ("4", "refused")):
        assert f"\n  {code}    {kind}" in out
    table = EXIT_CODES.split("\n\n")[0]
    assert table in out
    assert table in COMMANDS_GUIDE.read_text(), "the guide's CLI section must show the exit codes `bot --help` lists"


async def test_usage_errors_exit_2_with_argparse_s_message(tmp_path: Path) -> None:
    code, out, err = await bot(tmp_path, "approvals", "approve", "12x")
    assert (code, out) == (2, "")
    assert "bot approvals approve: error: argument id: '12x' is not an id" in err
    code, out, err = await bot(tmp_path)
    assert code == 2 and "error: the following arguments are required: COMMAND" in err
    code, out, err = await bot(tmp_path, "pause", env={"PORT": "abc"})
    assert (code, out) == (2, "")
    assert err.startswith("bot: error: invalid settings:") and "PORT (got 'abc')" in err


async def test_not_found_exits_3_and_says_where_to_look(tmp_path: Path) -> None:
    code, out, err = await bot(tmp_path, "approvals", "approve", "999")
    assert (code, out) == (3, "")
    assert err.splitlines()[-1] == "bot: error: there is no approval request 999; `bot approvals list` shows them"
    code, out, err = await bot(tmp_path, "credentials", "delete", "no.such")
    assert (code, out) == (3, "")
    assert err.splitlines()[-1] == "bot: error: there is no credential named no.such; `bot credentials list` shows them"
    code, out, err = await bot(tmp_path, "schedules", "pause", "999")
    assert (code, out) == (3, "")
    assert err.splitlines()[-1] == "bot: error: there is no schedule 999; `bot schedules list` shows them"
    code, out, err = await bot(tmp_path, "approvals", "revoke", "999")
    assert (code, out) == (3, "")
    assert err.splitlines()[-1].endswith("grant 999; `bot approvals grants` shows them")


async def test_an_unreachable_database_exits_1_without_its_password(tmp_path: Path, unused_port: int) -> None:
    url = f"postgresql://admin:S3cret-pw-771@127.0.0.1:{unused_port}/bot"  # nothing listens there
    for command in (("pause",), ("migrate",), ("approvals", "list"), ("schedules", "list"), ("web", "logout-all")):
        code, out, err = await bot(tmp_path, *command, env={"DATABASE_URL": url})
        assert (code, out) == (1, ""), (command, err)
        assert err.startswith(f"bot: error: could not open or migrate the database "
                              f"postgresql+asyncpg://admin:***@127.0.0.1:{unused_port}/bot: "), err
        assert "check DATABASE_URL" in err and "Traceback" not in err
        assert "S3cret" not in err


async def test_a_password_with_a_raw_at_sign_is_refused_without_showing_any_of_it(tmp_path: Path) -> None:
    """Unescaped, the tail of such a password parses as the host name, and would be printed as one."""
    url = "postgresql://admin:S3cret@tail-771@127.0.0.1:1/bot"
    for command in (("pause",), ("run",)):
        code, out, err = await bot(tmp_path, *command, env={"DATABASE_URL": url})
        assert (code, out) == (2, "")
        assert "DATABASE_URL" in err and "%40" in err
        assert "S3cret" not in err and "tail-771" not in err


def test_error_text_is_masked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no .env here
    monkeypatch.setenv("LLM_API_KEY", "sk-live-abcdef123456")
    said = masked("failed with key sk-live-abcdef123456 on postgresql://u:pa@ss/w0rd@db.internal/bot")
    assert "sk-live-abcdef123456" not in said and "pa@ss" not in said and "w0rd" not in said
    assert "postgresql://u:***@db.internal/bot" in said
    monkeypatch.setenv("PORT", "abc")  # settings that do not load: the raw environment is masked
    assert "abcdef123456" not in masked("key sk-live-abcdef123456")
