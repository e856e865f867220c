"""Every table of the service, imported in one place for Alembic and the schema checks."""

from __future__ import annotations

from service.db.base import Base
from service.db.meta import MemoriaMeta
from service.queue.models import Job
from service.tenants.models import ApiKey, Tenant

metadata = Base.metadata

__all__ = ["ApiKey", "Job", "MemoriaMeta", "Tenant", "metadata"]
