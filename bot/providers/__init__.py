"""LLM providers: build the one the settings ask for."""

from __future__ import annotations

from bot.errors import BotError
from bot.settings import Settings
from core.providers import Provider


def build_provider(settings: Settings) -> Provider:
    if settings.provider == "demo":
        from bot.providers.demo import DemoProvider

        return DemoProvider()
    if settings.provider == "openai":
        from bot.providers.openai_compat import OpenAICompatibleProvider

        return OpenAICompatibleProvider(
            base_url=settings.llm_base_url,
            api_key=settings.llm_api_key,
            model=settings.llm_model or "",
            timeout_s=settings.llm_timeout_s,
            stream=settings.llm_stream,
        )
    if settings.provider == "anthropic":
        from bot.providers.anthropic import AnthropicProvider

        return AnthropicProvider(
            base_url=settings.llm_base_url,
            api_key=settings.llm_api_key,
            model=settings.llm_model or "",
            timeout_s=settings.llm_timeout_s,
            stream=settings.llm_stream,
        )
    raise BotError(f"LLM_PROVIDER={settings.provider} is not available; use 'openai', 'anthropic' or 'demo'")
