"""Whether a conversation holds text from outside it: words the model read there that nobody in it wrote.

People's words count by who wrote them (core.trust). Beside them the model reads tool results, and a result may carry
anyone's text: a web page, a command's output, an outsider's message in a shared channel, an MCP server's answer, a
skill's file; so does a file shared with a message. An instruction hidden in such text steers the model at the level
of the person who asked. So what would outlive the conversation is a person's to allow once such text is in it:
``remember`` and ``forget`` ask first (a card with the exact text, core.memory.tools), and the memory pass reads only
people's words (core.memory.memory_pass).
"""

from __future__ import annotations

from core.store import ConversationStore
from core.tools import ToolRegistry


class OutsideText:
    def __init__(self, conversations: ConversationStore, tools: ToolRegistry) -> None:
        self.conversations = conversations
        self.tools = tools  # which tools bring outside text (``Tool.outside_text``), looked up when asked

    async def in_conversation(self, session_id: str) -> bool:
        """Whether the conversation holds a shared file's text, or a call of a tool that brings outside text (one no
        longer registered counts: what it returned is still in the conversation)."""
        called, files = await self.conversations.calls_and_files(session_id)
        return files or any(self._brings_outside_text(name) for name in called)

    def _brings_outside_text(self, name: str) -> bool:
        tool = self.tools.get(name)
        return tool is None or tool.outside_text
