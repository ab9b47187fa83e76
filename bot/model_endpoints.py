"""The models the bot calls, as the settings and bot.toml name them: the primary (LLM_*), the fallback
(LLM_FALLBACK_*, SPEC §17) and each agent's own ([[agents]] ``model`` / ``provider`` / ``base_url`` / ``api_key_env``).

A key goes only where it was configured for: the primary's LLM_API_KEY reaches another model only at the primary's
own endpoint (same provider, same base URL); an agent or a fallback elsewhere sends its own key, or none.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from dotenv import dotenv_values

from bot.errors import SettingsError

if TYPE_CHECKING:
    from bot.config.agents import AgentTable
    from bot.settings import ProviderName, Settings


@dataclass(frozen=True)
class ModelEndpoint:
    provider: ProviderName
    base_url: str | None
    model: str
    names: str  # the settings that say where it is (errors, `bot doctor`): "LLM_BASE_URL, LLM_API_KEY and LLM_MODEL"
    api_key: str | None = field(default=None, repr=False)
    key_name: str | None = None  # the variable the key came from (masked under that name)


def primary_endpoint(settings: Settings) -> ModelEndpoint:
    return ModelEndpoint(settings.provider, settings.llm_base_url, settings.llm_model or settings.provider,
                         "LLM_BASE_URL, LLM_API_KEY and LLM_MODEL", settings.llm_api_key, "LLM_API_KEY")


def fallback_endpoint(settings: Settings) -> ModelEndpoint | None:
    """LLM_FALLBACK_*, when LLM_FALLBACK_MODEL is set (``fallback_problem`` has checked the combination)."""
    if not settings.llm_fallback_model:
        return None
    provider = settings.llm_fallback_provider or settings.provider
    base_url = settings.llm_fallback_base_url or (settings.llm_base_url if provider == settings.provider else None)
    key, key_name = settings.llm_fallback_api_key, "LLM_FALLBACK_API_KEY"
    if key is None and provider == settings.provider and base_url == settings.llm_base_url:
        key, key_name = settings.llm_api_key, "LLM_API_KEY"  # the primary's own endpoint: its key is at home there
    return ModelEndpoint(provider, base_url, settings.llm_fallback_model,
                         "LLM_FALLBACK_BASE_URL, LLM_FALLBACK_API_KEY and LLM_FALLBACK_MODEL", key, key_name)


def fallback_problem(settings: Settings) -> str | None:
    """One line on a fallback that cannot work as set; None when it can (or none is set)."""
    unused = [name for name, value in (("LLM_FALLBACK_PROVIDER", settings.llm_fallback_provider),
                                       ("LLM_FALLBACK_BASE_URL", settings.llm_fallback_base_url),
                                       ("LLM_FALLBACK_API_KEY", settings.llm_fallback_api_key)) if value]
    if not settings.llm_fallback_model:
        if unused:
            return (f"{' and '.join(unused)} set without LLM_FALLBACK_MODEL: the fallback model is configured by "
                    "LLM_FALLBACK_MODEL (e.g. gpt-4o-mini); set it, or remove the others")
        return None
    fallback = fallback_endpoint(settings)
    assert fallback is not None
    if fallback.provider == "demo":
        return ("LLM_FALLBACK_MODEL needs a real provider: set LLM_FALLBACK_PROVIDER to openai or anthropic "
                "(and LLM_FALLBACK_BASE_URL / LLM_FALLBACK_API_KEY)")
    if fallback.provider == "anthropic" and not fallback.api_key and not fallback.base_url:
        return "LLM_FALLBACK_API_KEY is required for an Anthropic fallback model (an Anthropic API key, sk-ant-…)"
    primary = primary_endpoint(settings)
    if (fallback.provider, fallback.base_url, fallback.model) == (primary.provider, primary.base_url, primary.model):
        return ("LLM_FALLBACK_MODEL names the primary model itself at the same endpoint: it would fail with it; name "
                "another model, or another endpoint with LLM_FALLBACK_BASE_URL")
    return None


def agent_endpoints(tables: list[AgentTable] | None, settings: Settings, config: Path, *,
                    env_file: Path | None = Path(".env")) -> dict[str, ModelEndpoint]:
    """Each agent with a model of its own, by name (the others use the primary). Its key is read from the
    environment (or ``.env``) variable its ``api_key_env`` names."""
    dotenv: dict[str, str | None] = dict(dotenv_values(env_file)) if env_file and env_file.exists() else {}
    found: dict[str, ModelEndpoint] = {}
    for index, table in enumerate(tables or []):
        if not (table.model or table.provider or table.base_url or table.api_key_env):
            continue
        where = f"{config}: agents[{index}]"
        provider = table.provider or settings.provider
        if provider == "demo":
            raise SettingsError(f"{where}.model: there is no model endpoint to ask for it (LLM_PROVIDER is demo); set "
                                "the agent's provider and base_url, or LLM_BASE_URL and LLM_MODEL")
        base_url = table.base_url or (settings.llm_base_url if provider == settings.provider else None)
        key, key_name = None, table.api_key_env
        if table.api_key_env is not None:
            key = os.environ.get(table.api_key_env) or str(dotenv.get(table.api_key_env) or "") or None
            if key is None:
                raise SettingsError(f"{where}.api_key_env: the environment variable {table.api_key_env} is not set; "
                                    "set it to that agent's API key")
        elif provider == settings.provider and base_url == settings.llm_base_url:
            key, key_name = settings.llm_api_key, "LLM_API_KEY"  # the primary's own endpoint
        if provider == "anthropic" and key is None and table.base_url is None:
            raise SettingsError(f"{where}.api_key_env is required for provider anthropic: name the environment "
                                "variable holding that agent's Anthropic key")
        model = table.model or settings.llm_model
        if not model:
            raise SettingsError(f"{where}.model is required: LLM_MODEL is not set")
        found[table.name] = ModelEndpoint(provider, base_url, model, f"{where} (base_url, api_key_env, model)", key,
                                          key_name)
    return found
