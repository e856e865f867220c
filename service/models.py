"""Every table of the service, imported in one place for Alembic and the schema checks."""

from __future__ import annotations

from service.db.base import Base
from service.db.meta import MemoriaMeta
from service.ends.models import Memo
from service.events.models import Event
from service.messages.models import Conversation, Message
from service.profiles.models import ProfileRevision, ProfileRow
from service.queue.models import Job
from service.tenants.models import ApiKey, Tenant

metadata = Base.metadata

__all__ = [
    "ApiKey",
    "Conversation",
    "Event",
    "Job",
    "Memo",
    "MemoriaMeta",
    "Message",
    "ProfileRevision",
    "ProfileRow",
    "Tenant",
    "metadata",
]
