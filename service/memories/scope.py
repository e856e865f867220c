"""Which memories a conversation may see or write: the scope rule, written once and used by
every reader and writer of memories (REST, the historian's tools, MCP, the context)."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import ColumnElement, and_, false, or_

from service.memories.models import Memory


@dataclass(frozen=True)
class ScopeFilter:
    """Which scopes a conversation may see or write.

    A group (group_id, maybe a user): the group's GROUP memories, its MEMBER_IN_GROUP memories
    (of that user, or of everyone when no user is named), and the user's GLOBAL ones.
    A private chat (``ScopeFilter.private``): that user's PRIVATE and GLOBAL memories. PRIVATE
    ones are never read anywhere else.
    """

    group_id: str | None
    user_id: str | None
    scopes: tuple[str, ...] = ("GLOBAL", "GROUP", "MEMBER_IN_GROUP")

    def where(self) -> ColumnElement[bool]:
        """The hard filter as SQL."""
        parts: list[ColumnElement[bool]] = []
        if self.group_id and "GROUP" in self.scopes:
            parts.append(and_(Memory.scope == "GROUP", Memory.group_id == self.group_id))
        if self.group_id and "MEMBER_IN_GROUP" in self.scopes:
            member = and_(Memory.scope == "MEMBER_IN_GROUP", Memory.group_id == self.group_id)
            if self.user_id:
                member = and_(member, Memory.user_id == self.user_id)
            parts.append(member)
        if self.user_id and "GLOBAL" in self.scopes:
            parts.append(and_(Memory.scope == "GLOBAL", Memory.user_id == self.user_id))
        if self.user_id and not self.group_id and "PRIVATE" in self.scopes:
            parts.append(and_(Memory.scope == "PRIVATE", Memory.user_id == self.user_id))
        return or_(*parts) if parts else false()

    @classmethod
    def private(cls, user_id: str) -> ScopeFilter:
        """The private chat of ``user_id``: their PRIVATE and GLOBAL memories."""
        return cls(None, user_id, ("PRIVATE", "GLOBAL"))

    def allows(self, scope: str, group_id: str | None, user_id: str | None) -> bool:
        """Whether this conversation may write a memory bound like that."""
        if scope not in self.scopes:
            return False
        if scope == "GROUP":
            return bool(self.group_id) and group_id == self.group_id and user_id is None
        if scope == "MEMBER_IN_GROUP":
            return bool(self.group_id) and group_id == self.group_id and user_id is not None
        if scope == "PRIVATE":
            return (
                not self.group_id
                and group_id is None
                and user_id is not None
                and user_id == self.user_id
            )
        return (
            group_id is None
            and user_id is not None
            and (self.user_id == user_id or (self.group_id is not None and self.user_id is None))
        )
