"""Approval policies (SPEC §16 ``[[policies]]``): the rule matrix, shell command lines read as a shell
reads them, the file's validation, and the dry run (`bot policies check`)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from bot.cli import main
from bot.config.file import load_policies
from bot.errors import SettingsError
from core.policies import Policy, PolicyAction, PolicyBook
from core.shell_syntax import command_variants, simple_command
from core.tools import Risk

ALLOW, DENY, ASK = PolicyAction.ALLOW, PolicyAction.DENY, PolicyAction.ASK


def book(*rules: Policy) -> PolicyBook:
    return PolicyBook([Policy(**{**r.__dict__, "number": n}) for n, r in enumerate(rules, 1)])


def shell(policies: PolicyBook, command: str, trust: str | None = None) -> PolicyAction:
    return policies.rule("shell_run", {"command": command}, risk=Risk.GATED, trust=trust).action


# -- the shell's grammar, the tricky inputs -------------------------------------------------------------

@pytest.mark.parametrize("line", [
    "echo allowed-1", "echo 'a;b|c&d'", 'echo "a;b"', r"echo a\;b", r"echo a\|b", "ls -la /tmp",
    "echo '$(rm x)'", "echo '`rm x`'", "grep -r 'a && b' .",
])
def test_plain_commands(line: str) -> None:
    assert simple_command(line)


@pytest.mark.parametrize("line", [
    "echo allowed-2; rm x", "a && b", "a || b", "a | b", "a & b", "a &", "echo `rm x`", "echo $(rm x)",
    'echo "$(rm x)"', 'echo "`rm x`"', "echo > /etc/passwd", "cat < /etc/shadow", "cat <<EOF\nrm -rf /\nEOF",
    "echo a\nrm x", "echo a\rrm x", "echo a\\\nrm x", "rm${IFS}-rf${IFS}/", "echo $HOME", 'echo "$HOME"',
    "(rm x)", "{ rm x; }", "echo 'unterminated", 'echo "unterminated', "echo trailing\\", "",
    "   ", "echo <(rm x)", "x=1 && y", "echo a;", "echo ${PATH}",
])
def test_compound_or_expanding_lines_are_not_plain(line: str) -> None:
    assert not simple_command(line)


@pytest.mark.parametrize(("line", "inside"), [
    ("echo ok; rm -rf /", "rm -rf /"),
    ("echo ok && sudo -u root /bin/rm -rf /", "rm -rf /"),
    ('echo "$(rm -rf /)"', "rm -rf /"),
    ("echo `rm -rf /`", "rm -rf /"),
    ("r''m -rf /", "rm -rf /"),
    ('"rm" -rf /', "rm -rf /"),
    (r"\rm -rf /", "rm -rf /"),
    ("rm${IFS}-rf${IFS}/", "rm -rf /"),
    ("rm$IFS-rf$IFS/", "rm -rf /"),
    ("FOO=1 rm -rf /", "rm -rf /"),
    ("find . | xargs -0 rm -rf", "rm -rf"),
    ("cat <<EOF\nrm -rf /\nEOF", "rm -rf /"),
    ("timeout 5 rm -rf /", "rm -rf /"),
    ("env -i rm -rf /", "rm -rf /"),
])
def test_every_simple_command_inside_a_line_is_seen(line: str, inside: str) -> None:
    assert inside in command_variants(line)


# -- the rule matrix ------------------------------------------------------------------------------------

def test_allow_runs_only_a_plain_command_its_glob_matches() -> None:
    policies = book(Policy(tool="shell_run", match="echo allowed-*", action=ALLOW))
    assert shell(policies, "echo allowed-1") is ALLOW
    assert shell(policies, "echo allowed-2; rm x") is ASK  # falls through to the built-in risk
    assert shell(policies, "echo allowed-3 && rm x") is ASK
    assert shell(policies, "echo allowed-$(rm x)") is ASK
    assert shell(policies, "echo allowed-4 > /etc/x") is ASK
    assert shell(policies, "echo allowed-5\nrm x") is ASK
    assert shell(policies, "echo other") is ASK
    ruling = policies.rule("shell_run", {"command": "echo allowed-2; rm x"}, risk=Risk.GATED)
    assert "not one plain command" in ruling.why and ruling.policy is None


def test_deny_is_checked_against_every_simple_command() -> None:
    policies = book(Policy(tool="shell_run", match="rm *", action=DENY),
                    Policy(tool="shell_run", match="*", action=ALLOW))
    assert shell(policies, "rm -rf /") is DENY
    assert shell(policies, "echo hi; rm -rf /") is DENY
    assert shell(policies, "echo $(rm -rf /)") is DENY
    assert shell(policies, "sudo /bin/rm -rf /") is DENY
    assert shell(policies, "echo hi") is ALLOW
    assert shell(policies, "echo hi; ls") is ASK  # compound: the allow-all rule never matches it


@pytest.mark.parametrize("line", [
    "eval rm -rf /work", "sh -c 'rm -rf x'", "bash -lc 'echo a; rm -rf x'", "busybox rm -rf x", "su -c 'rm x'",
    "chroot / rm x", "flock f rm x", "ionice rm x", "find . -exec rm -rf {} \\;", "env -S'rm x'",
    "/bin/r[m] -rf x", "/bin/r? -rf x", "watch rm x", "nsenter -t 1 rm x",
])
def test_a_deny_rule_is_not_dodged_by_wrappers_shells_or_patterns(line: str) -> None:
    policies = book(Policy(tool="shell_run", match="rm *", action=DENY),
                    Policy(tool="shell_run", match="*", action=ALLOW))
    assert shell(policies, line) is not ALLOW


def test_what_a_call_does_is_matched_not_only_how_it_is_written() -> None:
    policies = book(Policy(tool="http_request", match="* https://api.example.com/admin/*", action=DENY),
                    Policy(tool="http_request", match="GET https://api.example.com/*", action=ALLOW),
                    Policy(tool="message_send", match="#announcements *", action=DENY),
                    Policy(tool="schedule_cancel", match='{"schedule_id":7}', action=DENY))

    def http(url: str) -> PolicyAction:
        return policies.rule("http_request", {"method": "GET", "url": url}, risk=Risk.GATED).action

    assert http("https://api.example.com/x/../admin/users") is DENY
    assert http("https://api.example.com/%61dmin/users") is DENY
    assert http("https://API.EXAMPLE.COM/admin/users") is DENY
    assert http("https://api.example.com/health") is ALLOW
    assert policies.rule("message_send", {"channel": "#Announcements", "text": "hi"}, risk=Risk.GATED).action is DENY
    assert policies.rule("schedule_cancel", {"schedule_id": 7.0}, risk=Risk.SAFE).action is DENY


def test_an_allow_rule_never_runs_a_call_that_hands_over_a_credential() -> None:
    policies = book(Policy(tool="http_request", match="GET https://api.example.com/*", action=ALLOW),
                    Policy(tool="shell_run", match="git fetch*", action=ALLOW))
    with_credential = {"method": "GET", "url": "https://api.example.com/x", "credential": "api.token"}
    ruling = policies.rule("http_request", with_credential, risk=Risk.GATED)
    assert ruling.action is ASK and "hands a credential" in ruling.why
    assert policies.rule("shell_run", {"command": "git fetch", "credentials": ["git_ssh_command"]},
                         risk=Risk.GATED).action is ASK
    assert shell(policies, "git fetch") is ALLOW


def test_first_matching_rule_wins_and_tool_globs_match_names() -> None:
    policies = book(Policy(tool="shell_*", match="kubectl get *", action=ALLOW),
                    Policy(tool="shell_run", match="kubectl *", action=DENY),
                    Policy(tool="*", action=ASK, approvers=("U2",), quorum=1))
    assert shell(policies, "kubectl get pods") is ALLOW
    assert shell(policies, "kubectl delete pod x") is DENY
    ruling = policies.rule("time_now", {}, risk=Risk.SAFE)
    assert ruling.action is ASK and ruling.policy is not None and ruling.policy.number == 3


def test_canonical_texts_of_other_tools() -> None:
    policies = book(Policy(tool="http_request", match="GET https://api.example.com/*", action=ALLOW),
                    Policy(tool="message_send", match="#ops *", action=DENY),
                    Policy(tool="schedule_create", match='*"destination":"C9"*', action=DENY))
    http = policies.rule("http_request", {"method": "get", "url": "https://api.example.com/health"}, risk=Risk.GATED)
    assert http.action is ALLOW
    evil = policies.rule("http_request", {"method": "GET", "url": "https://api.example.com.evil.test/"},
                         risk=Risk.GATED)
    assert evil.action is ASK
    assert policies.rule("message_send", {"channel": "ops", "text": "hi"}, risk=Risk.GATED).action is DENY
    assert policies.rule("schedule_create", {"prompt": "x", "destination": "C9", "every": "1h"},
                         risk=Risk.GATED).action is DENY


def test_no_rule_leaves_the_built_in_risk() -> None:
    policies = book(Policy(tool="shell_run", match="echo *", action=ALLOW))
    assert policies.rule("http_request", {"url": "https://x.test"}, risk=Risk.GATED).action is ASK
    assert policies.rule("time_now", {}, risk=Risk.SAFE).action is ALLOW
    assert PolicyBook().rule("shell_run", {"command": "echo"}, risk=Risk.GATED).action is ASK


def test_a_rule_for_some_trust_levels_applies_only_to_those_senders() -> None:
    policies = book(Policy(tool="shell_run", action=DENY, trust=("guest", "external")),
                    Policy(tool="shell_run", match="echo *", action=ALLOW, trust=("admin",)))
    assert shell(policies, "echo hi", trust="guest") is DENY
    assert shell(policies, "echo hi", trust="admin") is ALLOW
    assert shell(policies, "echo hi", trust="member") is ASK
    assert shell(policies, "echo hi", trust=None) is ASK  # unknown: only rules naming no level apply


# -- http_request headers and body ----------------------------------------------------------------------

STATUS = "https://status.example.com/health"


def http_call(policies: PolicyBook, headers: dict[str, str] | None = None, body: str | None = None,
              method: str = "GET", url: str = STATUS) -> PolicyAction:
    args: dict[str, object] = {"method": method, "url": url}
    if headers is not None:
        args["headers"] = headers
    if body is not None:
        args["body"] = body
    return policies.rule("http_request", args, risk=Risk.GATED).action


def test_an_allow_rule_covers_headers_and_a_body_only_if_it_names_them() -> None:
    policies = book(Policy(tool="http_request", match="GET https://status.example.com/*", action=ALLOW))
    assert http_call(policies) is ALLOW
    assert http_call(policies, headers={}, body="") is ALLOW  # nothing carried: nothing to cover
    assert http_call(policies, {"X-HTTP-Method-Override": "DELETE"}) is ASK
    assert http_call(policies, {"Cookie": "session=abc"}) is ASK
    assert http_call(policies, body='{"confirm": true}') is ASK
    ruling = policies.rule("http_request", {"method": "GET", "url": STATUS, "headers": {"Cookie": "a=b"}},
                           risk=Risk.GATED)
    assert ruling.policy is None and "Cookie" in ruling.why and "does not name" in ruling.why


def test_an_allow_rule_that_names_headers_covers_only_those() -> None:
    policies = book(Policy(tool="http_request", match="GET https://status.example.com/*", action=ALLOW,
                           headers=("Accept: *", "X-Trace-Id: [0-9a-f]*")))
    assert http_call(policies, {"Accept": "application/json"}) is ALLOW
    assert http_call(policies, {"accept": "text/html", "X-TRACE-ID": "abc123"}) is ALLOW  # names: any case
    assert http_call(policies) is ALLOW
    assert http_call(policies, {"Accept": "*/*", "Cookie": "a=b"}) is ASK  # every header must be covered
    assert http_call(policies, {"X-Trace-Id": "zz"}) is ASK  # the value is matched too
    assert http_call(policies, {"Accept-Encoding": "gzip"}) is ASK  # a name glob is not a prefix
    assert http_call(policies, {"Accept": "*/*"}, body="x") is ASK  # no body named: a body is asked about


def test_an_allow_rule_that_names_a_body_covers_only_bodies_it_matches() -> None:
    policies = book(Policy(tool="http_request", match="POST https://status.example.com/search", action=ALLOW,
                           headers=("Content-Type: application/json",), body='{"q": *}'))
    search = "https://status.example.com/search"
    assert http_call(policies, {"Content-Type": "application/json"}, '{"q": "disk"}', "POST", search) is ALLOW
    assert http_call(policies, {"Content-Type": "application/json"}, '{"delete": 1}', "POST", search) is ASK
    assert http_call(policies, {"Content-Type": "text/plain"}, '{"q": "disk"}', "POST", search) is ASK
    assert http_call(policies, None, None, "POST", search) is ALLOW


def test_an_allow_rule_that_turns_a_call_down_for_its_headers_lets_no_later_allow_rule_run_it() -> None:
    """First matching rule wins: the narrow rule matched and did not cover the headers, so the call is asked,
    even if a looser allow rule follows; a later deny or ask rule still decides it."""
    policies = book(Policy(tool="http_request", match="GET https://status.example.com/*", action=ALLOW),
                    Policy(tool="http_request", match="* https://status.example.com/*", action=ALLOW,
                           headers=("*: *",), body="*"),
                    Policy(tool="http_request", match="GET https://other.example.com/*", action=ALLOW,
                           headers=("*: *",)))
    assert http_call(policies, {"X-HTTP-Method-Override": "DELETE"}) is ASK
    assert http_call(policies, body="x") is ASK
    assert http_call(policies, {"Cookie": "a=b"}, url="https://other.example.com/x") is ALLOW  # rule 1 is silent
    denied = book(Policy(tool="http_request", match="GET https://status.example.com/*", action=ALLOW),
                  Policy(tool="http_request", action=DENY, headers=("Cookie: *",)),
                  Policy(tool="http_request", action=ASK, approvers=("U9",)))
    assert http_call(denied, {"Cookie": "a=b"}) is DENY
    ruling = denied.rule("http_request", {"method": "GET", "url": STATUS, "headers": {"Accept": "*/*"}},
                         risk=Risk.GATED)
    assert ruling.action is ASK and ruling.policy is not None and ruling.policy.approvers == ("U9",)


def test_deny_and_ask_rules_that_name_headers_or_a_body_match_only_calls_that_carry_them() -> None:
    policies = book(Policy(tool="http_request", action=DENY, headers=("cookie: *", "X-HTTP-Method-Override: *")),
                    Policy(tool="http_request", action=DENY, body="*password*"),
                    Policy(tool="*", action=ASK, approvers=("U9",), headers=("Authorization: *",)),
                    Policy(tool="http_request", match="* https://status.example.com/*", action=ALLOW,
                           headers=("*: *",), body="*"))
    assert http_call(policies, {"COOKIE": "a=b"}) is DENY
    why = policies.rule("http_request", {"method": "GET", "url": STATUS, "headers": {"Cookie": "a=b"}},
                        risk=Risk.GATED).why
    assert why.endswith("decides: the call carries a header matching 'cookie: *'") and "a=b" not in why
    assert http_call(policies, {"X-HTTP-Method-Override": " DELETE"}) is DENY
    assert http_call(policies, body='{"password": "x"}', method="POST") is DENY
    asked = policies.rule("http_request", {"method": "GET", "url": STATUS, "headers": {"Authorization": "x"}},
                          risk=Risk.GATED)
    assert asked.action is ASK and asked.policy is not None and asked.policy.number == 3
    assert http_call(policies, {"Accept": "*/*"}, body="hello", method="POST") is ALLOW  # none of them match
    assert http_call(policies) is ALLOW
    # A shell command carries no headers: rule 3 does not apply (the built-in risk asks).
    assert policies.rule("shell_run", {"command": "echo hi"}, risk=Risk.GATED).policy is None


def test_a_non_http_tool_is_not_narrowed_by_headers_or_body() -> None:
    """For other tools every argument is in the matched text already; only http_request carries headers."""
    policies = book(Policy(tool="*", action=DENY, headers=("*: *",)),
                    Policy(tool="my_plugin", match="*", action=ALLOW))
    assert policies.rule("my_plugin", {"headers": {"Cookie": "x"}}, risk=Risk.GATED).action is ALLOW


# -- bot.toml -------------------------------------------------------------------------------------------

def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bot.toml"
    path.write_text(text)
    return path


def test_a_file_with_only_policies_loads_them_and_the_default_agent(tmp_path: Path) -> None:
    from bot.config.file import load_agents

    path = _file(tmp_path, '[[policies]]\ntool = "shell_run"\nmatch = "echo *"\naction = "allow"\n\n'
                           '[[policies]]\ntool = "shell_run"\napprovers = ["U1", "U2", "S9"]\nquorum = 2\n'
                           'notify = ["thread", "dm"]\nremind_after_s = 60\nescalate_to = ["U3"]\ntimeout_s = 600\n')
    first, second = load_policies(path)
    assert (first.action, first.match, first.number) == (ALLOW, "echo *", 1)
    assert (second.approvers, second.quorum, second.notify, second.remind_after_s, second.escalate_to,
            second.timeout_s) == (("U1", "U2", "S9"), 2, ("thread", "dm"), 60.0, ("U3",), 600.0)
    assert [a.name for a in load_agents(path, default_instructions=None)] == ["default"]
    assert load_policies(tmp_path / "absent.toml") == []


def test_headers_and_body_are_read_from_the_file(tmp_path: Path) -> None:
    path = _file(tmp_path, '[[policies]]\ntool = "http_*"\nmatch = "POST https://api.example.com/search"\n'
                           'action = "allow"\nheaders = ["Accept: *", "Content-Type: application/json"]\n'
                           'body = \'{"q": *}\'\n')
    [rule] = load_policies(path)
    assert (rule.headers, rule.body) == (("Accept: *", "Content-Type: application/json"), '{"q": *}')
    assert "headers" in rule.describe() and "body" in rule.describe()


@pytest.mark.parametrize(("text", "problem"), [
    ('[[policies]]\nmatch = "x"\n', "tool must be"),
    ('[[policies]]\ntool = "shell_run"\naction = "maybe"\n', "action must be one of"),
    ('[[policies]]\ntool = "shell_run"\naction = "allow"\napprovers = ["U1"]\n', "only apply to rules that ask"),
    ('[[policies]]\ntool = "shell_run"\naction = "deny"\ntimeout_s = 5\n', "only apply to rules that ask"),
    ('[[policies]]\ntool = "shell_run"\nquorum = 0\n', "quorum must be"),
    ('[[policies]]\ntool = "shell_run"\nquorum = 3\napprovers = ["U1", "U2"]\n', "could never be reached"),
    ('[[policies]]\ntool = "shell_run"\nquorum = true\n', "quorum must be"),
    ('[[policies]]\ntool = "shell_run"\nnotify = ["email"]\n', "notify must list"),
    ('[[policies]]\ntool = "shell_run"\nnotify = []\n', "notify must list"),
    ('[[policies]]\ntool = "shell_run"\naction = "deny"\ntrust = []\n', "trust is empty"),
    ('[[policies]]\ntool = "shell_run"\naction = "deny"\ntrust = ["staff"]\n', "trust must list levels"),
    ('[[policies]]\ntool = "shell_run"\napprovers = ["U1\\n", "U2"]\nquorum = 2\n', "is not a user id"),
    ('[[policies]]\ntool = "shell_run"\napprovers = ["alice"]\n', "is not a user id"),
    ('[[policies]]\ntool = "shell_run"\ntimeout_s = -1\n', "timeout_s must be"),
    ('[[policies]]\ntool = "shell_run"\ntimeout_s = 1e9\n', "timeout_s must be"),
    ('[[policies]]\ntool = "shell_run"\nremind_after_s = 1e9\n', "remind_after_s must be"),
    ('[[policies]]\ntool = "shell_run"\nescalate_to = ["U3"]\n', "needs remind_after_s"),
    ('[[policies]]\ntool = "shell_run"\nescalate_to = ["bob"]\nremind_after_s = 5\n', "is not a user id"),
    ('[[policies]]\ntool = "shell_run"\nmach = "x"\n', "unknown keys"),
    ('[[policies]]\ntool = "http_request"\naction = "allow"\nheaders = "Accept: *"\n', "headers must be a list"),
    ('[[policies]]\ntool = "http_request"\naction = "allow"\nheaders = [1]\n', "headers must be a list"),
    ('[[policies]]\ntool = "http_request"\naction = "allow"\nheaders = []\n', "headers is empty"),
    ('[[policies]]\ntool = "http_request"\naction = "allow"\nheaders = ["Accept"]\n', "'Name: value'"),
    ('[[policies]]\ntool = "http_request"\naction = "allow"\nheaders = [": x"]\n', "'Name: value'"),
    ('[[policies]]\ntool = "http_request"\naction = "allow"\nheaders = ["Accept: a\\nb"]\n', "line break"),
    ('[[policies]]\ntool = "http_request"\naction = "allow"\nbody = 3\n', "body must be"),
    ('[[policies]]\ntool = "http_request"\naction = "allow"\nbody = ""\n', "body must be"),
    ('[[policies]]\ntool = "http_request"\naction = "allow"\nbody = ["*"]\n', "body must be"),
    ('[[policies]]\ntool = "shell_run"\naction = "deny"\nheaders = ["Cookie: *"]\n', "apply only to http_request"),
    ('[[policy]]\ntool = "shell_run"\n', "unknown tables"),
    ("policies = 3\n", "array of tables"),
])
def test_a_bad_rule_is_refused_at_start_with_what_to_fix(tmp_path: Path, text: str, problem: str) -> None:
    with pytest.raises(SettingsError, match=problem):
        load_policies(_file(tmp_path, text))


# -- the dry run ----------------------------------------------------------------------------------------

def test_policies_check_names_the_deciding_rule(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    path = _file(tmp_path, '[[policies]]\ntool = "shell_run"\nmatch = "echo allowed-*"\naction = "allow"\n\n'
                           '[[policies]]\ntool = "http_request"\nmatch = "DELETE *"\naction = "deny"\n\n'
                           '[[policies]]\ntool = "shell_run"\napprovers = ["U1", "U2"]\nquorum = 2\n')
    monkeypatch.setenv("BOT_CONFIG", str(path))
    monkeypatch.setenv("BOT_HOME", str(tmp_path / "home"))
    assert main(["policies", "check", "shell_run", "echo allowed-1"]) == 0
    assert capsys.readouterr().out.startswith("ALLOW: rule 1 (allow 'shell_run' matching 'echo allowed-*') decides")
    assert main(["policies", "check", "shell_run", "echo allowed-2; rm x"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ASK: rule 1") and "not one plain command" in out and "rule 3 (ask 'shell_run')" in out
    assert "asks: U1, U2; quorum 2" in out
    assert main(["policies", "check", "http_request", "DELETE https://api.example.com/x"]) == 0
    assert capsys.readouterr().out.startswith("DENY: rule 2")
    assert main(["policies", "check", "time_now", "{}"]) == 0
    assert capsys.readouterr().out.startswith("ALLOW: no rule matches: time_now is safe")
    assert main(["policies", "check", "my_plugin", "not json"]) != 0


def test_policies_check_takes_a_call_s_headers_and_body(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    path = _file(tmp_path, '[[policies]]\ntool = "http_request"\nmatch = "GET https://status.example.com/*"\n'
                           'action = "allow"\nheaders = ["Accept: *"]\n')
    monkeypatch.setenv("BOT_CONFIG", str(path))
    monkeypatch.setenv("BOT_HOME", str(tmp_path / "home"))
    url = "https://status.example.com/health"
    assert main(["policies", "check", "http_request", f"GET {url}", "--header", "accept: text/plain"]) == 0
    assert capsys.readouterr().out.startswith("ALLOW: rule 1")
    assert main(["policies", "check", "http_request", f"GET {url}", "--header", "Accept: */*",
                 "--header", "X-HTTP-Method-Override: DELETE"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ASK: rule 1") and "X-HTTP-Method-Override" in out
    assert main(["policies", "check", "http_request", f"GET {url}", "--body", "x"]) == 0
    assert capsys.readouterr().out.startswith("ASK: rule 1")
    assert main(["policies", "check", "http_request", f"GET {url}", "--header", "no colon"]) != 0
    assert main(["policies", "check", "shell_run", "echo hi", "--body", "x"]) != 0


# -- allow rules whose glob admits flags that load files (issue 32, point 7) ------------------------------

KUBECTL = ("--kubeconfig", "-f", "--filename", "-k", "--kustomize")
GIT_ANYWHERE = ("-O", "--open-files-in-pager", "--upload-pack", "-u", "--receive-pack", "--exec", "--template",
                "--config")  # after the subcommand too: programs to run, a template or config for a clone
GIT = (*GIT_ANYWHERE, "-c", "--config-env", "--exec-path", "-C", "--git-dir", "--work-tree")  # the rest: first only


@pytest.mark.parametrize(("match", "flags"), [
    ("kubectl get *", KUBECTL),
    ("kubectl get pods -n *", KUBECTL),  # a * anywhere takes any words, flags included
    ("kubectl get pods*", KUBECTL),
    ("/usr/local/bin/kubectl get *", KUBECTL),
    ("kubectl get pods", ()),
    ("kubectl get pods -o json", ()),
    ("git *", GIT),
    ("git log *", GIT_ANYWHERE),  # git's -c and -C load files only before the subcommand
    ("git log -1", ()),
    ("helm list *", ("--kubeconfig", "-f", "--values", "--post-renderer", "--repository-config",
                     "--registry-config")),
    ("npm view *", ("--userconfig", "--globalconfig", "--prefix", "--script-shell")),
    ("kubectl get [a-z]*", KUBECTL),  # a character class is one character the glob admits, then the star
    ("kubectl get pods -[no] *", KUBECTL),
    ("kubectl get pod?", ()),
    ("terraform plan *", ("-var-file", "-plugin-dir")),  # -chdir only before the subcommand
    ("terraform *", ("-var-file", "-plugin-dir", "-chdir")),
    ("git*", GIT),
    ("echo *", ()),
])
def test_an_allow_glob_that_admits_flags_that_load_files_is_named(match: str, flags: tuple[str, ...]) -> None:
    from bot.policy_check import loading_flags

    found = loading_flags(Policy(tool="shell_run", match=match, action=ALLOW))
    assert (found[1] if found else ()) == flags
    assert loading_flags(Policy(tool="shell_run", match=match, action=DENY)) is None
    assert loading_flags(Policy(tool="shell_run", match=match, action=ASK)) is None


def test_policies_check_and_the_start_warn_about_flags_that_load_files(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    path = _file(tmp_path, '[[policies]]\ntool = "shell_run"\nmatch = "kubectl get pods"\naction = "allow"\n\n'
                           '[[policies]]\ntool = "shell_*"\nmatch = "kubectl get *"\naction = "allow"\n')
    monkeypatch.setenv("BOT_CONFIG", str(path))
    monkeypatch.setenv("BOT_HOME", str(tmp_path / "home"))
    assert main(["policies", "check", "shell_run", "kubectl get pods"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ALLOW: rule 1")
    [warning] = [line for line in out.splitlines() if line.startswith("warning:")]
    assert "rule 2 (allow 'shell_*' matching 'kubectl get *')" in warning and "--kubeconfig" in warning
    assert "-f" in warning and "--kustomize" in warning and "rule 1" not in warning


async def test_the_bot_warns_at_start_about_flags_that_load_files(
        make_settings: Any, start_gateway: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import logging

    path = _file(tmp_path, '[[policies]]\ntool = "shell_run"\nmatch = "kubectl get *"\naction = "allow"\n')
    caplog.set_level(logging.WARNING)
    await start_gateway(make_settings(bot_config=path))
    logged = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("rule 1 (allow 'shell_run' matching 'kubectl get *')" in m and "--kubeconfig" in m for m in logged)


# -- the audit trail ------------------------------------------------------------------------------------

async def test_audit_export_has_who_what_when_where_and_outcome_and_no_secret(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        database_url: str | None) -> None:
    import asyncio
    import csv
    import io
    import json
    from datetime import UTC, datetime, timedelta

    from bot.keys import load_keyring
    from bot.settings import load_settings
    from core.agents import Agent, AgentDirectory
    from core.approval_policy import ApprovalPolicy
    from core.clock import SystemClock
    from core.credentials import CredentialService
    from core.events import EventBus
    from core.store import ApprovalStore, CredentialStore, Database
    from core.store.schedules import ScheduleStore
    from core.store.tables import ApprovalRow, ScheduleRow, SessionRow

    monkeypatch.setenv("BOT_HOME", str(tmp_path / "home"))
    if database_url:
        monkeypatch.setenv("DATABASE_URL", database_url)
    secret = "sk-live-AUDITNEVERSHOWN-42"
    now = datetime.now(UTC)

    async def record() -> None:
        settings = load_settings()
        db = Database(settings.resolved_database_url)
        await db.migrate()
        try:
            async with db.write() as s:
                s.add(SessionRow(id="slack:T1:C1:1.0", channel="slack", agent="default", status="idle",
                                 reply_ref="{}", place="slack:T1:C1", created_at=now, updated_at=now))
            approvals = ApprovalStore(db)
            parked = await approvals.park(ApprovalRow(
                session_id="slack:T1:C1:1.0", tool_call_id="c1", tool="shell_run", arguments=json.dumps(
                    {"command": f"echo {secret}"}), agent="default", place="slack:T1:C1", requester="U1",
                risk="gated", status="pending", parked_at=now, expires_at=now + timedelta(minutes=5), quorum=2))
            await approvals.vote(parked.id, "U7", "approve", reason=None, now=now)
            await approvals.vote(parked.id, "U8", "deny", reason="=HYPERLINK(\"http://evil.test\")", now=now)
            service = CredentialService(CredentialStore(db), load_keyring(settings), EventBus(), SystemClock(),
                                        ApprovalPolicy(("requester",), ()), AgentDirectory([Agent()]))
            await service.set_secret("api.token", secret, scope="agent", agent="default", by="operator:ops")
            schedules = ScheduleStore(db)
            row = await schedules.add(ScheduleRow(
                prompt="check", trigger=json.dumps({"every_s": 3600}), destination="#ops", destination_id="C9",
                channel="slack", agent="default", creator="U1", origin_session="slack:T1:C1:1.0", status="active",
                created_at=now))
            assert row.id is not None
            await schedules.set_status(row.id, "paused", now=now, by="U1", only_from=("active",))
        finally:
            await db.close()

    await record()
    since = (now - timedelta(days=1)).date().isoformat()
    assert await asyncio.to_thread(main, ["audit", "export", "--since", since, "--format", "jsonl"]) == 0
    out = capsys.readouterr().out
    assert secret not in out
    lines = [json.loads(line) for line in out.splitlines()]
    by_what = {line["what"]: line for line in lines}
    vote = by_what["approval.vote.approve"]
    assert (vote["who"], vote["subject"], vote["where"], vote["outcome"]) == ("U7", "approval:1", "slack:T1:C1",
                                                                             "approve")
    assert by_what["approval.denied"]["who"] == "U8" and by_what["approval.denied"]["outcome"] == "denied"
    assert by_what["credential.stored"]["who"] == "operator:ops"
    assert by_what["schedule.created"]["where"] == "slack:T1:C1:1.0"
    assert by_what["schedule.paused"]["who"] == "U1" and all(line["at"] for line in lines)
    assert await asyncio.to_thread(main, ["audit", "export", "--since", since, "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [r["what"] for r in rows] == [line["what"] for line in lines] and secret not in json.dumps(rows)
    assert not any(cell.startswith(("=", "+", "-", "@")) for r in rows for cell in r.values())  # never a formula
    later = (now + timedelta(days=2)).date().isoformat()
    assert await asyncio.to_thread(main, ["audit", "export", "--since", later]) == 0
    assert capsys.readouterr().out == ""
    assert await asyncio.to_thread(main, ["audit", "export", "--since", "yesterday"]) != 0


def test_a_csv_cell_never_starts_a_formula() -> None:
    import csv
    import io
    from datetime import UTC, datetime

    from bot.audit_export import write
    from core.views import AuditEntry

    out = io.StringIO()
    write([AuditEntry(datetime(2026, 11, 30, tzinfo=UTC), "=cmd|'/C calc'!A0", "@SUM(1)", "-2+3", None)], "csv", out)
    [row] = list(csv.DictReader(io.StringIO(out.getvalue())))
    assert (row["who"], row["what"], row["subject"]) == ("'=cmd|'/C calc'!A0", "'@SUM(1)", "'-2+3")


def test_a_date_at_the_calendar_s_edge_is_refused_not_a_traceback() -> None:
    from bot.audit_export import parse_day
    from bot.errors import BotError

    for value in ("0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-10:00", "yesterday", ""):
        with pytest.raises(BotError):
            parse_day(value)


async def test_a_rule_that_asks_is_not_skipped_by_a_firing_s_preapproved_destination(tmp_path: Path) -> None:
    """A scheduled firing may post to its approved destination unasked, but not past a rule that asks."""
    from core.agents import Agent, AgentDirectory
    from core.approval_policy import ApprovalPolicy
    from core.approvals import ApprovalBroker
    from core.clock import SystemClock
    from core.events import EventBus
    from core.store import ApprovalStore, Database
    from core.tools import Tool, ToolContext

    async def send(_ctx: ToolContext, _args: dict[str, object]) -> str:
        return "sent"

    tool = Tool("message_send", "post", {"type": "object"}, Risk.GATED, send, pattern_arg="channel")
    db = Database(f"sqlite:///{tmp_path}/x.db")
    await db.migrate()
    try:
        def broker(*rules: Policy) -> ApprovalBroker:
            return ApprovalBroker(ApprovalStore(db), EventBus(), SystemClock(), ApprovalPolicy(("U1",), ()),
                                  AgentDirectory([Agent()]), timeout_s=5, policies=book(*rules))

        ctx = ToolContext(session_id="s", turn_id=1, agent="default", sender="U1", interactive=False,
                          preapproved=(("message_send", "#ops"),))
        args = {"channel": "#ops", "text": "daily report"}
        assert (await broker().authorize(ctx, tool, args)).allowed  # no rule: the firing's approval covers it
        asked = await broker(Policy(tool="message_send", approvers=("U7", "U8"), quorum=2)).authorize(ctx, tool, args)
        assert not asked.allowed and "nobody can be asked" in asked.result
    finally:
        await db.close()


async def test_the_gate_says_whether_a_person_approved_this_very_call(tmp_path: Path) -> None:
    """Core decides who was asked (shell_run gives an unasked command a fresh HOME): an allow rule, a grant and
    a firing's preapproval run a call unasked; a person's approval of the call is the only "asked"."""
    from datetime import UTC, datetime

    from core.agents import Agent, AgentDirectory
    from core.approval_policy import ApprovalPolicy
    from core.approvals import ApprovalBroker
    from core.clock import SystemClock
    from core.events import EventBus
    from core.store import ApprovalStore, Database
    from core.store.tables import SessionRow, TurnRow
    from core.tools import Tool, ToolContext

    async def run(_ctx: ToolContext, _args: dict[str, object]) -> str:
        return "ran"

    tool = Tool("shell_run", "run", {"type": "object"}, Risk.GATED, run, pattern_arg="command")
    db = Database(f"sqlite:///{tmp_path}/x.db")
    await db.migrate()
    try:
        now = datetime.now(UTC)
        async with db.write() as s:
            s.add(SessionRow(id="s", channel="slack", agent="default", status="idle", reply_ref="{}", place="p",
                             created_at=now, updated_at=now))
            await s.flush()
            s.add(TurnRow(id=1, session_id="s", agent="default", status="running", created_at=now))
        broker = ApprovalBroker(ApprovalStore(db), EventBus(), SystemClock(), ApprovalPolicy(("U1",), ()),
                                AgentDirectory([Agent()]), timeout_s=5,
                                policies=book(Policy(tool="shell_run", match="echo allowed-*", action=ALLOW)))
        ctx = ToolContext(session_id="s", turn_id=1, agent="default", sender="U1", place="p", call_id="c1",
                          preapproved=(("shell_run", "echo preapproved"),))
        ruled = await broker.authorize(ctx, tool, {"command": "echo allowed-1"})
        preapproved = await broker.authorize(ctx, tool, {"command": "echo preapproved"})
        assert ruled.allowed and not ruled.asked and preapproved.allowed and not preapproved.asked

        args = {"command": "echo by-hand"}
        request = await broker.request(session_id="s", turn_id=1, call_id="c1", tool="shell_run", args=args,
                                       agent="default", place="p", requester="U1")
        assert (await broker.decide(request.id, "always", by="U1")).won
        approved = await broker.recover(ctx, tool, args)  # the person's approval of this very call
        assert approved is not None and approved.allowed and approved.asked
        granted = await broker.authorize(replace(ctx, call_id="c2"), tool, args)  # the same call again: the grant
        assert granted.allowed and not granted.asked
    finally:
        await db.close()
