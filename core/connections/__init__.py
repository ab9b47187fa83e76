"""OAuth connections (SPEC §16): tokens the agent acts through, consent, and the pause that waits for it."""
