"""The built-in web chat (SPEC §12): the embedded default's page, and the second channel adapter."""
