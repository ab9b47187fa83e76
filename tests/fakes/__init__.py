"""Fakes of external services, as real aiohttp servers the product talks to over HTTP."""
