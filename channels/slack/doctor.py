"""``bot doctor`` for Slack: auth.test with the bot token (one workspace), or who may install and auth.test with
every installed workspace's own token (multi-workspace mode)."""

from __future__ import annotations

from channels.slack.manifest import BOT_SCOPES, tools_lacking
from channels.slack.settings import SlackSettings
from core.plugins import Check, DoctorContext


async def slack_checks(settings: SlackSettings, context: DoctorContext) -> list[Check]:
    if settings.oauth:
        return await installation_checks(settings, context)
    if settings.mode is not None:
        return [await _one_workspace(settings)]
    return []


async def _one_workspace(settings: SlackSettings) -> Check:
    from slack_sdk.errors import SlackApiError
    from slack_sdk.web.async_client import AsyncWebClient

    client = AsyncWebClient(token=settings.bot_token, base_url=settings.api_url)
    try:
        response = await client.auth_test()
    except SlackApiError as exc:
        data = exc.response.data if isinstance(exc.response.data, dict) else {}
        return Check("slack", False, f"auth.test failed: {data.get('error') or exc.response.status_code}",
                     "check SLACK_BOT_TOKEN (xoxb-…) and that the app is installed in the workspace")
    except Exception as exc:
        return Check("slack", False, f"cannot reach {settings.api_url}: {type(exc).__name__}",
                     "check SLACK_API_URL and the network")
    granted = {s.strip() for s in str(response.headers.get("x-oauth-scopes", "")).split(",") if s.strip()}
    missing = sorted(set(BOT_SCOPES) - granted) if granted else []
    who = f"bot {response.get('user')} in team {response.get('team')}"
    if missing:
        return Check("slack", False, f"{who}; missing scopes: {', '.join(missing)}{_unoffered(granted)}",
                     "update the app from `bot manifest` and reinstall it to the workspace")
    return Check("slack", True, f"{who}; scopes match the manifest ({settings.mode} mode)")


async def installation_checks(settings: SlackSettings, context: DoctorContext) -> list[Check]:
    """Who may install, then one check per install: its token opens, Slack accepts it, and it has the scopes the
    bot asks for."""
    allowed = settings.allowed_team_set
    if allowed is None:
        who = Check("slack allowed teams", True, "SLACK_ALLOWED_TEAMS is not set: any workspace can install the bot, "
                    "and everyone in an installed workspace counts as a guest (no gated tools, approvals, "
                    "credentials or schedules; BOT_ADMINS still can)",
                    "set SLACK_ALLOWED_TEAMS to the workspace ids (T…) you trust", warning=True)
    else:
        who = Check("slack allowed teams", True, f"only {', '.join(sorted(allowed))} may install and are served")
    return [who, *await _installations(settings, context, allowed)]


async def _installations(settings: SlackSettings, context: DoctorContext,
                         allowed: frozenset[str] | None) -> list[Check]:
    from slack_sdk.errors import SlackApiError
    from slack_sdk.web.async_client import AsyncWebClient

    from channels.slack.installs import VaultInstallationStore
    from channels.slack.store import SlackInstallStore
    from core.errors import VaultError
    from core.store import Database

    keys = context.keys()
    if isinstance(keys, str):
        return [Check("slack installs", False, keys, "fix BOT_SECRET_KEYS: the installs' tokens are sealed")]
    db = Database(context.database_url)
    try:
        store = VaultInstallationStore(SlackInstallStore(db), keys)
        try:
            rows = await store.installations()
        except Exception as exc:  # a new database (`bot run` creates the tables) or one not reachable
            return [Check("slack installs", True, f"cannot list them yet ({type(exc).__name__})",
                          "start the bot once (`bot run` migrates the database), then open /slack/install",
                          warning=True)]
        if not rows:
            return [Check("slack installs", True, "multi-workspace mode, installed nowhere yet",
                          "open /slack/install (under BOT_PUBLIC_URL) and add the app to a workspace", warning=True)]
        checks = []
        wanted = set(settings.scope_list)
        for row in rows:
            name = f"slack {row.team_id or row.enterprise_id} ({row.team_name or 'unnamed'})"
            if allowed is not None and row.team_id not in allowed:
                checks.append(Check(name, True, "installed but not in SLACK_ALLOWED_TEAMS: not served",
                                    "add it to SLACK_ALLOWED_TEAMS, or uninstall the app there", warning=True))
                continue
            try:
                token = store.bot_of(row).bot_token
            except VaultError as exc:
                checks.append(Check(name, False, str(exc), "add the key it names to BOT_SECRET_KEYS"))
                continue
            client = AsyncWebClient(token=token, base_url=settings.api_url)
            try:
                response = await client.auth_test()
            except SlackApiError as exc:
                data = exc.response.data if isinstance(exc.response.data, dict) else {}
                checks.append(Check(name, False, f"auth.test failed: {data.get('error') or exc.response.status_code}",
                                    "install the app into that workspace again through /slack/install"))
                continue
            except Exception as exc:
                checks.append(Check(name, False, f"cannot reach {settings.api_url}: {type(exc).__name__}",
                                    "check SLACK_API_URL and the network"))
                continue
            granted = {s.strip() for s in str(response.headers.get("x-oauth-scopes", "")).split(",") if s.strip()}
            missing = sorted(wanted - granted) if granted else []
            who = f"bot {response.get('user')} in team {response.get('team')}"
            if missing:
                checks.append(Check(name, False, f"{who}; missing scopes: {', '.join(missing)}{_unoffered(granted)}",
                                    "update the app from `bot manifest --distribution` and install it again"))
            else:
                checks.append(Check(name, True, f"{who}; scopes match (multi-workspace mode)"))
        return checks
    finally:
        await db.close()


def _unoffered(granted: set[str]) -> str:
    """The Slack tools the token's scopes leave out (they are not offered to the model there)."""
    lacking = tools_lacking(granted)
    return f"; tools not offered for want of them: {', '.join(lacking)}" if lacking else ""
