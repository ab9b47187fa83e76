"""``/bot freeze <until> <reason>`` and ``/bot unfreeze`` (SPEC §17), for admins; and what ``/bot status`` says of a
freeze. The grammar's other words are in ``core.commands``."""

from __future__ import annotations

from core.approval_policy import ApprovalPolicy
from core.errors import InvalidInput
from core.freezes import Freezes, parse_until
from core.replies import Marks

ADMINS_ONLY = "Only admins (BOT_ADMINS) can {verb} changes."


async def freeze_command(freezes: Freezes, policy: ApprovalPolicy, *, user: str, channel: str, words: list[str],
                         name: str, marks: Marks) -> str:
    """``words``: what followed ``freeze`` (the end time, then the reason)."""
    if not policy.is_admin(user, channel=channel):  # said before anything is parsed or read
        return ADMINS_ONLY.format(verb="freeze")
    if len(words) < 2:
        return (f"Usage: {marks.code(f'{name} freeze <until> <reason>')}, the end as ISO 8601 with a timezone "
                "(2026-12-24T18:00Z) or a span (2h, 30m, 1d).")
    try:
        freeze = await freezes.freeze(parse_until(words[0], freezes.clock.now()), " ".join(words[1:]), by=user)
    except InvalidInput as exc:
        return f"Not frozen: {marks.text(str(exc))}"
    return (f"Frozen: {marks.text(freeze.describe())}. Calls that need approval are refused until then; "
            f"{marks.code(f'{name} unfreeze')} lifts it.")


async def unfreeze_command(freezes: Freezes, policy: ApprovalPolicy, *, user: str, channel: str, marks: Marks) -> str:
    if not policy.is_admin(user, channel=channel):
        return ADMINS_ONLY.format(verb="unfreeze")
    lifted = await freezes.lift(by=user)
    said = f"Lifted {len(lifted)} freeze{'' if len(lifted) == 1 else 's'}." if lifted else "No freeze was set."
    window = freezes.window_in_force()
    if window is not None:  # configuration, not a stored freeze: only bot.toml changes it
        said += f" A [[freezes]] window of bot.toml still holds ({marks.text(window.describe())}): it can't be lifted."
    return said


async def freeze_status(freezes: Freezes | None, marks: Marks) -> str:
    """What ``/bot status`` adds during a freeze ("" without one)."""
    freeze = await freezes.active() if freezes is not None else None
    return f" :snowflake: {marks.text(freeze.describe()[:1].upper() + freeze.describe()[1:])}." if freeze else ""
