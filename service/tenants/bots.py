"""Per-bot settings within a tenant: a persona and query settings layered over the tenant's.

A tenant hosting several bot characters keeps them under ``settings.bots.<bot_id>``. Only
settings: what the bots remember about people stays the tenant's, shared by all its bots,
and a bot's settings never widen who sees what.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from service.context import ID_MAX
from service.errors import Invalid, field_of
from service.settings import QuerySettings

SECTION = "bots"
# What a bot may set for itself; the rest of the settings are the tenant's alone.
BOT_KEYS = ("persona", "query")
PERSONA_MAX = 20_000
# Query settings that decide whose data a bot's tools may read: a bot may turn them off, never
# on, so a tenant that keeps them off keeps them off for every bot it hosts (and turning one
# off on the tenant later turns it off for bots that never mentioned it).
NARROW_ONLY = ("allow_cross_group_tools",)


def check_persona(value: Any, field: str) -> str:
    """A persona as stored: a text of at most ``PERSONA_MAX`` characters (empty: none)."""
    if not isinstance(value, str) or len(value) > PERSONA_MAX:
        raise Invalid(f"the persona is a text of at most {PERSONA_MAX} characters", field=field)
    return value


def check_bot_id(value: Any, field: str) -> str:
    """A bot id as a conversation context carries it: 1..ID_MAX characters, no '/', no
    surrounding spaces (the context strips them, so such an id would never be matched)."""
    if (
        not isinstance(value, str)
        or not 1 <= len(value) <= ID_MAX
        or "/" in value
        or value != value.strip()
    ):
        raise Invalid(
            f"a bot id is 1..{ID_MAX} characters, without '/' or surrounding spaces", field=field
        )
    return value


def layered(tenant: QuerySettings, layer: dict[str, Any]) -> QuerySettings:
    """The tenant's query settings with one bot's overrides on top; the settings in
    ``NARROW_ONLY`` stay off where the tenant has them off."""
    merged = QuerySettings.model_validate({**tenant.model_dump(), **layer})
    narrowed = {name: getattr(tenant, name) and getattr(merged, name) for name in NARROW_ONLY}
    return merged.model_copy(update=narrowed)


def validate(value: Any, tenant: QuerySettings, cap: int) -> dict[str, dict[str, Any]]:
    """Check ``settings.bots`` (bot id → its persona and query overrides over ``tenant``,
    the tenant's query settings in force); return it cleaned. ``Invalid`` names the field."""
    where = f"settings.{SECTION}"
    if not isinstance(value, dict):
        raise Invalid("must be an object of bot ids to their settings", field=where)
    if len(value) > cap:
        raise Invalid(f"a tenant configures at most {cap} bots", field=where)
    cleaned: dict[str, dict[str, Any]] = {}
    for bot_id, layer in value.items():
        here = f"{where}.{bot_id}"
        check_bot_id(bot_id, here)
        if not isinstance(layer, dict):
            raise Invalid("must be an object", field=here)
        unknown = sorted(set(layer) - set(BOT_KEYS))
        if unknown:
            raise Invalid(
                f"a bot sets only {' and '.join(BOT_KEYS)}, not {unknown[0]!r}",
                field=f"{here}.{unknown[0]}",
            )
        entry: dict[str, Any] = {}
        if "persona" in layer:
            entry["persona"] = check_persona(layer["persona"], f"{here}.persona")
        if "query" in layer:
            entry["query"] = _query(layer["query"], tenant, f"{here}.query")
        cleaned[bot_id] = entry
    return cleaned


def _query(query: Any, tenant: QuerySettings, where: str) -> dict[str, Any]:
    """A bot's query overrides, as the values they are read as (``"false"`` stored as
    ``false``: the narrowing compares values, not their spelling)."""
    if not isinstance(query, dict):
        raise Invalid("must be an object", field=where)
    try:
        given = QuerySettings.model_validate({**tenant.model_dump(), **query})
    except ValidationError as exc:
        error = exc.errors()[0]
        raise Invalid(error["msg"], field=field_of(error, where)) from exc
    for name in NARROW_ONLY:
        if name in query and getattr(given, name):
            raise Invalid(
                "a bot may only turn this off: whose data its tools read across groups is"
                " the tenant's setting",
                field=f"{where}.{name}",
            )
    return given.model_dump(include=set(query))
