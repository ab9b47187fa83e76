"""Memory across an agent's threads (SPEC §17): its rules, tools, prompt section and optional memory pass."""

from core.memory.memory_pass import MemoryPass
from core.memory.service import MemoryLimits, MemoryService, Writer
from core.memory.shown import PinnedMemories
from core.memory.tools import memory_tools

__all__ = ["MemoryLimits", "MemoryPass", "MemoryService", "PinnedMemories", "Writer", "memory_tools"]
