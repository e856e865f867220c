"""Where an item may be shown, and who is reading: the privacy rule of every stored item.

Every item Memoria keeps is shown in one of four places:

- ``PRIVATE`` to a user: only in that user's private chat;
- ``GROUP`` of a group: in that group;
- ``MEMBER_IN_GROUP`` (a user in a group): in that group, about that member, to every member
  of it (what a member said in the group is known to the group, as the member's profile
  there is; never outside it);
- ``GLOBAL`` for a user: in every conversation of that user.

Events, messages, todos and memos are bound to the conversation they were said in (their
conversation key: ``g:<group>`` is GROUP, ``p:<user>`` is PRIVATE); memories carry the place
in their scope columns; a profile's kind is its place (``user`` is GLOBAL, ``group`` GROUP,
``member`` MEMBER_IN_GROUP, ``private`` PRIVATE).

Two functions decide everything:

- ``derive`` gives the widest place an item made from a source may have. It is never wider
  than the source's conversation unless the person marked that source as shareable, and a
  sensitive text (health, ids, contact data) is never widened. No wording decides consent.
- ``Viewer`` is a conversation reading; ``Viewer.sees`` and ``Viewer.where`` (the same rule,
  in Python and as SQL) are what every read filters on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, cast

from sqlalchemy import ColumnElement, and_, false, or_
from sqlalchemy.orm import QueryableAttribute

from service import pii
from service.context import ConversationContext, conversation_key

Scope = Literal["GLOBAL", "PRIVATE", "GROUP", "MEMBER_IN_GROUP"]
SCOPES: tuple[Scope, ...] = ("GLOBAL", "PRIVATE", "GROUP", "MEMBER_IN_GROUP")
# The scopes a group reads, and a private chat reads, when a reader names none.
GROUP_SCOPES: tuple[Scope, ...] = ("GLOBAL", "GROUP", "MEMBER_IN_GROUP")
PRIVATE_SCOPES: tuple[Scope, ...] = ("PRIVATE", "GLOBAL")


@dataclass(frozen=True)
class Visibility:
    """Where one item may be shown."""

    scope: Scope
    group_id: str | None = None
    user_id: str | None = None

    @classmethod
    def of_conversation(cls, key: str, about: str | None = None) -> Visibility:
        """An item said in the conversation ``key`` (``g:``/``p:``): PRIVATE to the private
        chat's user, MEMBER_IN_GROUP when it is about a member of the group, else GROUP."""
        kind, _, ident = key.partition(":")
        if kind == "p":
            return cls("PRIVATE", None, ident)
        if about:
            return cls("MEMBER_IN_GROUP", ident, about)
        return cls("GROUP", ident, None)

    def within(self, source: Visibility) -> bool:
        """Whether an item shown here reaches no one the ``source`` does not: made from a
        source, an item may stay as private as it or become more private, never wider."""
        if self.scope == "GLOBAL":
            return source == self
        if self.scope == "PRIVATE":
            return source.user_id == self.user_id or (
                source.scope == "GROUP" and self.user_id is not None
            )
        # GROUP or MEMBER_IN_GROUP of a group: the source is that group's, or the GLOBAL
        # place of the member it is about.
        if source.scope in ("GROUP", "MEMBER_IN_GROUP"):
            return source.group_id == self.group_id and (
                source.scope == "GROUP" or self.user_id == source.user_id
            )
        return source.scope == "GLOBAL" and self.user_id == source.user_id


def derive(key: str, about: str | None, *, marked: bool, text: str) -> Visibility:
    """The widest place an item made from one source may have.

    ``key`` is the conversation the source was said in, ``about`` whom it is about, ``marked``
    whether the person marked that very source as theirs to be known beyond it (``end``'s
    ``shareable``), ``text`` what it says. Marked, about a person, and not sensitive: GLOBAL
    for that person. Otherwise it stays where it was said."""
    said = Visibility.of_conversation(key, about)
    person = about or (said.user_id if said.scope == "PRIVATE" else None)
    if marked and person and not pii.sensitive(text):
        return Visibility("GLOBAL", None, person)
    return said


def narrowest(wanted: Visibility, ceiling: Visibility) -> Visibility:
    """``wanted`` where it is within ``ceiling``, else the ceiling itself: a GLOBAL wish for
    a group's member becomes MEMBER_IN_GROUP, a private chat's becomes PRIVATE."""
    return wanted if wanted.within(ceiling) else ceiling


# A profile's kind is its place.
PROFILE_SCOPES: dict[str, Scope] = {
    "user": "GLOBAL",
    "group": "GROUP",
    "member": "MEMBER_IN_GROUP",
    "private": "PRIVATE",
}


def of_profile(entity_type: str, entity_id: str, group_id: str | None = None) -> Visibility:
    """Where a profile is shown: a user's in all of their conversations, a group's in it, a
    member's in the group, a private one in the person's private chat."""
    scope = PROFILE_SCOPES[entity_type]
    if scope == "GROUP":
        return Visibility(scope, entity_id, None)
    return Visibility(scope, group_id if scope == "MEMBER_IN_GROUP" else None, entity_id)


@dataclass(frozen=True)
class Columns:
    """A table's columns that hold an item's place (memories: scope, group_id, user_id)."""

    scope: QueryableAttribute[str]
    group_id: QueryableAttribute[str | None]
    user_id: QueryableAttribute[str | None]


@dataclass(frozen=True)
class Viewer:
    """A conversation that reads, and which scopes it reads.

    A group (``group_id``, maybe a ``user_id``: the person served): the group's GROUP items,
    its MEMBER_IN_GROUP ones (of every member: said in the group, they are the group's to
    know, whoever is served), and the person's GLOBAL ones. A private chat
    (``Viewer.private``): the user's PRIVATE and GLOBAL items. PRIVATE items are read nowhere
    else.
    """

    group_id: str | None
    user_id: str | None
    scopes: tuple[str, ...] = GROUP_SCOPES

    @classmethod
    def private(cls, user_id: str) -> Viewer:
        """The private chat of ``user_id``."""
        return cls(None, user_id, PRIVATE_SCOPES)

    @classmethod
    def of(cls, context: ConversationContext) -> Viewer:
        """The conversation a call comes from: in a group, the person is the sender (or the
        user the bot serves)."""
        if context.request_type == "group":
            return cls(context.group_id, context.sender_id or context.user_id)
        return cls.private(context.private_user)

    @classmethod
    def of_key(cls, key: str, person: str | None = None) -> Viewer:
        """The conversation named by its key (``g:``/``p:``)."""
        kind, _, ident = key.partition(":")
        return cls(ident, person) if kind == "g" else cls.private(ident)

    @classmethod
    def narrowed(
        cls, group_id: str | None, user_id: str | None, scopes: Sequence[str] | None
    ) -> Viewer:
        """A reader named by its ids (REST query parameters), narrowed to ``scopes``. A
        PRIVATE scope is only ever read without a group, so a group's reader never reads it."""
        if group_id:
            return cls(group_id, user_id, tuple(scopes) if scopes else GROUP_SCOPES)
        return cls(None, user_id, tuple(scopes) if scopes else PRIVATE_SCOPES)

    @property
    def conversation_key(self) -> str:
        """The conversation's own key: the rows said in it (events, messages, todos, memos)."""
        if self.group_id:
            return conversation_key("group", self.group_id, None)
        return conversation_key("private", None, self.user_id)

    def sees(self, item: Visibility) -> bool:
        """Whether an item shown at ``item`` may be shown here (``where`` as Python)."""
        if item.scope not in self.scopes:
            return False
        if item.scope == "GROUP":
            return bool(self.group_id) and item.group_id == self.group_id
        if item.scope == "MEMBER_IN_GROUP":
            return bool(self.group_id) and item.group_id == self.group_id
        if item.scope == "GLOBAL":
            return bool(self.user_id) and item.user_id == self.user_id
        return not self.group_id and bool(self.user_id) and item.user_id == self.user_id

    def where(self, columns: Columns) -> ColumnElement[bool]:
        """``sees`` as SQL over a table's place columns."""
        parts: list[ColumnElement[bool]] = []
        if self.group_id and "GROUP" in self.scopes:
            parts.append(and_(columns.scope == "GROUP", columns.group_id == self.group_id))
        if self.group_id and "MEMBER_IN_GROUP" in self.scopes:
            parts.append(
                and_(columns.scope == "MEMBER_IN_GROUP", columns.group_id == self.group_id)
            )
        if self.user_id and "GLOBAL" in self.scopes:
            parts.append(and_(columns.scope == "GLOBAL", columns.user_id == self.user_id))
        if self.user_id and not self.group_id and "PRIVATE" in self.scopes:
            parts.append(and_(columns.scope == "PRIVATE", columns.user_id == self.user_id))
        return or_(*parts) if parts else false()

    def allows(self, scope: str, group_id: str | None, user_id: str | None) -> bool:
        """Whether this conversation may write an item bound like that: one it can read
        itself (in a group without a named person, a GLOBAL item of any member)."""
        if scope not in self.scopes:
            return False
        if scope == "GLOBAL" and self.group_id and not self.user_id:
            return group_id is None and user_id is not None
        if scope in ("GLOBAL", "PRIVATE") and group_id is not None:
            return False
        if scope == "GROUP" and user_id is not None:
            return False
        if scope == "MEMBER_IN_GROUP" and user_id is None:
            return False
        # Every member reads a member's items in the group, but a conversation that serves
        # one person writes only that person's: a turn of one member never files a fact
        # under another's name (the group's own reader, the historian, writes any member's).
        if scope == "MEMBER_IN_GROUP" and self.user_id and user_id != self.user_id:
            return False
        return self.sees(Visibility(cast(Scope, scope), group_id, user_id))

    # -- profiles: a profile's kind is its place ---------------------------------------------

    def profiles(self) -> list[tuple[str, str, str | None]]:
        """(kind, id, group) of the profiles a conversation is handed: the person's user
        profile; in a group the group's and the person's member profile there; in a private
        chat the person's private profile."""
        keys: list[tuple[str, str, str | None]] = []
        if self.user_id:
            keys.append(("user", self.user_id, None))
        if self.group_id:
            keys.append(("group", self.group_id, None))
            if self.user_id:
                keys.append(("member", self.user_id, self.group_id))
        elif self.user_id:
            keys.append(("private", self.user_id, None))
        return keys

    def profile_reach(self) -> dict[str, str | None]:
        """The parameters of a profile search's reach (``profiles.repository.search``): the
        group it is in (member and group profiles of no other group), the person (a user
        profile of someone else is read in a group only of its members), and the one private
        profile a private chat reads."""
        return {
            "group_id": self.group_id,
            "person": self.user_id,
            "private_of": None if self.group_id else self.user_id,
        }
