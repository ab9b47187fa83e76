"""LLM providers: build the one a model endpoint asks for (bot.model_endpoints)."""

from __future__ import annotations

from bot.errors import BotError
from bot.model_endpoints import ModelEndpoint
from bot.settings import Settings
from core.providers import Provider


def build_provider(settings: Settings, endpoint: ModelEndpoint | None = None) -> Provider:
    """The provider of ``endpoint`` (default: the primary, LLM_*), with the settings' timeouts and streaming."""
    from bot.model_endpoints import primary_endpoint

    endpoint = endpoint or primary_endpoint(settings)
    if endpoint.provider == "demo":
        from bot.providers.demo import DemoProvider

        return DemoProvider()
    if endpoint.provider == "openai":
        from bot.providers.openai_compat import OpenAICompatibleProvider

        return OpenAICompatibleProvider(
            base_url=endpoint.base_url,
            api_key=endpoint.api_key,
            model=endpoint.model,
            timeout_s=settings.llm_timeout_s,
            stream=settings.llm_stream,
            idle_timeout_s=settings.llm_idle_timeout_s,
        )
    if endpoint.provider == "anthropic":
        from bot.providers.anthropic import AnthropicProvider

        return AnthropicProvider(
            base_url=endpoint.base_url,
            api_key=endpoint.api_key,
            model=endpoint.model,
            timeout_s=settings.llm_timeout_s,
            stream=settings.llm_stream,
            idle_timeout_s=settings.llm_idle_timeout_s,
        )
    raise BotError(f"LLM_PROVIDER={endpoint.provider} is not available; use 'openai', 'anthropic' or 'demo'")
