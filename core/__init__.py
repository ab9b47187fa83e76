"""Channel-agnostic engine: store, gateway, agent runner, tools, events.

Nothing here imports from ``channels`` or ``bot``.
"""
