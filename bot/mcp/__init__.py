"""MCP tool servers (SPEC §16, ``[[mcp_servers]]``): their tools reach the model as ``<server>__<tool>``."""
