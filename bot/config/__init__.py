"""``bot.toml`` (``BOT_CONFIG``, SPEC §16): its tables as pydantic models, read and checked as a whole."""
