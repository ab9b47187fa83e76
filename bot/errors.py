"""The one exception root of ``bot``."""


class BotError(Exception):
    """A problem in settings or wiring, with a message meant for the operator."""


class SettingsError(BotError):
    pass
