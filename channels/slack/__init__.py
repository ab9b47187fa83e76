"""The Slack adapter (slack-bolt ``AsyncApp``): HTTP mode or Socket Mode. ``plugin.py`` is what the bot loads;
the adapter is imported when the channel is built, so commands that only read settings stay light."""
