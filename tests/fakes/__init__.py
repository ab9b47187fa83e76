"""Fakes of external services, as real aiohttp servers the product talks to over HTTP (llm, slack_api,
server); and in-process fakes for tests that drive core directly (core)."""
