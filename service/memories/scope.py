"""A memory's place is its scope columns: what ``service.visibility.Viewer.where`` filters on
for every reader and writer of memories (REST, the historian's tools, MCP, the context)."""

from __future__ import annotations

from service.memories.models import Memory
from service.visibility import Columns

MEMORY = Columns(Memory.scope, Memory.group_id, Memory.user_id)
