"""The one exception root of ``channels``."""


class ChannelError(Exception):
    """A channel adapter could not translate something."""


class MalformedPayload(ChannelError):
    """A correctly signed request whose content does not have the shape the platform documents."""
