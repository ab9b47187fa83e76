"""The application: settings, wiring, providers, built-in tools and the ``bot`` command."""

__version__ = "0.1.0"
