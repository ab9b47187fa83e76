"""``[[policies]]`` (SPEC §16, §17): approval rules, the first whose tool and match fit a call decides it."""

from __future__ import annotations

import fnmatch
import re
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, StringConstraints, field_validator, model_validator

from bot.config.table import Person, Problem, Says, Table, Text
from bot.people import people
from core.oncall import is_oncall
from core.policies import HTTP_TOOL, TRUST_LEVELS, Policy, PolicyAction

MAX_QUORUM = 20
MAX_WAIT_S = 7 * 24 * 3600  # a week: longer is surely a slip (a value in ms)
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # no header holds these (bot/tools/http.py refuses them)
_ASKING_KEYS = ("approvers", "quorum", "notify", "remind_after_s", "escalate_to", "timeout_s", "grant_ttl_s",
                "self_approval")
_SECONDS = f"a number of seconds above 0 and at most {MAX_WAIT_S}"


def _header_glob(glob: str) -> str:
    """One of ``headers``: a glob over one header's ``Name: value`` (core.policies matches names in any case).
    The refusal names the entry by its place, not its text."""
    name, colon, _ = glob.partition(":")
    if not colon or not name.strip():
        raise Problem("is not 'Name: value' (a glob for each, e.g. \"Accept: *\" or \"X-Request-Id: *\")")
    if _CONTROL.search(glob):
        raise Problem("holds a line break or another control character, which no header can")
    return glob


Seconds = Annotated[float, Field(gt=0, le=MAX_WAIT_S)]
Trust = Literal["admin", "member", "guest", "external", "bot"]  # core.policies.TRUST_LEVELS


class PolicyTable(Table):
    """An approval rule. `approvers`, `quorum`, `notify`, `remind_after_s`, `escalate_to`, `timeout_s` and
    `grant_ttl_s` apply only to rules that ask."""

    tool: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)] = Field(
        description="a tool name or a glob such as 'shell_*'")
    match: Text | None = Field(None, description="a non-empty glob over the call's text (shell_run: the command; "
                                                 "http_request: 'METHOD URL'; message_send: '#channel text'; "
                                                 "other tools: their arguments as compact JSON)")
    action: Literal["ask", "allow", "deny"] = Field("ask", description="one of ask, allow, deny (default ask)")
    approvers: list[Person] = Field([], description="a list of who may approve: user ids (U…), user group ids "
                                                    "(S…), 'requester', 'web' or oncall:<PagerDuty schedule id> "
                                                    "(default: the agent's)")
    quorum: int = Field(1, ge=1, le=MAX_QUORUM, description=f"a whole number from 1 to {MAX_QUORUM}: how many "
                                                            "distinct approvers must approve")
    notify: Annotated[list[Literal["thread", "dm"]], Says("must list thread and/or dm")] = Field(
        ["thread"], min_length=1, description="where to ask: a list of thread and/or dm (default [\"thread\"])")
    remind_after_s: Seconds | None = Field(None, description=f"{_SECONDS}: when to remind the approvers")
    escalate_to: list[Person] = Field([], description="a list of people who join the approvers at the reminder: "
                                                      "user ids, user group ids, 'requester', 'web' or "
                                                      "oncall:<PagerDuty schedule id>")
    timeout_s: Seconds | None = Field(None, description=f"{_SECONDS}: when the request expires "
                                                        "(default APPROVAL_TIMEOUT_S)")
    trust: Annotated[list[Trust], Says(f"must list levels among {', '.join(TRUST_LEVELS)}")] = Field(
        [], description=f"the sender levels the rule applies to, among {', '.join(TRUST_LEVELS)} (default: all)")
    headers: list[Annotated[str, Field(min_length=1), AfterValidator(_header_glob)]] = Field(
        [], description="a list of globs over one header's 'Name: value', e.g. [\"Accept: *\"] (http_request)")
    body: Text | None = Field(None, description="a non-empty glob over the request body, e.g. '{\"q\": *}' "
                                                "(http_request)")
    grant_ttl_s: Seconds | None = Field(None, description=f"{_SECONDS}: offer Always allow and Allow in this "
                                                          "thread on this rule's requests (quorum 1 only), each "
                                                          "grant lasting this long")
    during_freeze: Literal["refuse", "ask"] = Field(
        "refuse", description="during a change freeze, 'refuse' its calls (default) or 'ask' (only admins approve)")
    self_approval: bool | None = Field(None, description="true or false: whether a sender of the turn (who asked, "
                                                         "or whose message joined it) may approve it "
                                                         "(default BOT_SELF_APPROVAL)")
    step_up: bool = Field(False, description="true or false: an approval counts only once the approver confirms "
                                             "it with a passkey on the bot's page (needs BOT_PUBLIC_URL)")

    @field_validator("trust")
    @classmethod
    def _some_trust(cls, value: list[str]) -> list[str]:
        if not value:
            raise Problem("is empty: list the sender levels it applies to, or remove it")
        return value

    @field_validator("headers")
    @classmethod
    def _some_headers(cls, value: list[str]) -> list[str]:
        if not value:
            raise Problem("is empty: list the headers the rule covers (e.g. \"Accept: *\"), or remove it")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> PolicyTable:
        asking = [key for key in _ASKING_KEYS if key in self.model_fields_set]
        if self.action != "ask" and asking:
            raise Problem(f": {', '.join(asking)} only apply to rules that ask (action = 'ask')")
        # Admins may vote too, but a quorum should not need them: each named entry is one person (a group: many).
        # One person however written ("U1" and "slack:U1" are Slack's U1: one vote).
        named = {people().qualified(a) for a in self.approvers}
        # "S1" or "slack:S1"; a rota (oncall:P1) may have several people on call too
        groups = any(a.rpartition(":")[2].startswith("S") or is_oncall(a) for a in named)
        if self.quorum > 1 and named and not groups and self.quorum > len(named):
            raise Problem(f"is {self.quorum}, but only {len(named)} approvers are named: it could never be reached",
                          at=("quorum",))
        if ("headers" in self.model_fields_set or self.body is not None) \
                and not fnmatch.fnmatchcase(HTTP_TOOL, self.tool):
            raise Problem(f": headers and body apply only to http_request calls, and tool {self.tool!r} "
                          "does not match it")
        remind, timeout = self.remind_after_s, self.timeout_s
        if remind is not None and timeout is not None and remind >= timeout:
            raise Problem(f"({remind:g}) must be below timeout_s ({timeout:g}): the request would expire first",
                          at=("remind_after_s",))
        if self.action == "deny" and "during_freeze" in self.model_fields_set:
            raise Problem("applies only to rules that ask or allow: a deny rule refuses during a freeze too",
                          at=("during_freeze",))
        if self.escalate_to and remind is None:
            raise Problem("needs remind_after_s: they join the approvers at the reminder", at=("escalate_to",))
        return self

    @model_validator(mode="after")
    def _step_up_asks(self) -> PolicyTable:
        if self.step_up and self.action != "ask":
            raise Problem("only applies to rules that ask (action = 'ask'): nobody approves the others",
                          at=("step_up",))
        return self

    def policy(self, number: int) -> Policy:
        """The rule as core applies it; ``number`` is its place in the file, from 1."""
        return Policy(tool=self.tool, number=number, match=self.match, action=PolicyAction(self.action),
                      approvers=tuple(self.approvers), quorum=self.quorum, notify=tuple(dict.fromkeys(self.notify)),
                      escalate_to=tuple(self.escalate_to), remind_after_s=self.remind_after_s,
                      timeout_s=self.timeout_s, trust=tuple(self.trust), headers=tuple(self.headers), body=self.body,
                     grant_ttl_s=self.grant_ttl_s, during_freeze=self.during_freeze,
                     self_approval=self.self_approval, step_up=self.step_up)
