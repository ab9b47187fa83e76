"""Channel adapters: translate platform events into core calls and core events into messages."""
