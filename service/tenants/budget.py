"""A tenant's budget of model calls per minute, shared by every job of the tenant.

Whatever a tenant's chats ask (a member posting "remember this" a hundred times), its jobs
call the historian's model at most ``llm_calls_per_minute`` times in a window (a minute),
counted in the database, so every worker of every process spends the same budget. A call
past it is not made until the next window: its job waits, or goes back to the queue until
then (``Deferred``); it is never failed for it, and nothing it was to write is lost.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from service.db.engine import Database
from service.llm import ChatModel, ChatResult
from service.observability import LLM_BUDGET_REACHED
from service.queue.worker import Deferred, JobRun, current_run
from service.settings import ChatModelSettings
from service.tenants import repository

log = logging.getLogger("service.tenants.budget")

# The tenant setting (an operator's, through the admin API) over the deployment's default.
SETTING = "llm_calls_per_minute"
MAX_CALLS_PER_MINUTE = 1_000_000


def calls_per_minute(overrides: dict[str, Any], defaults: ChatModelSettings) -> int:
    """The tenant's budget: its own setting, else the deployment's."""
    value = overrides.get(SETTING)
    return int(value) if isinstance(value, int) else defaults.calls_per_minute


class BudgetedChat:
    """The historian's model, each call in a job first counted against the job's tenant's
    budget; a call outside any job (none is bound) is not counted."""

    def __init__(self, model: ChatModel, db: Database, settings: ChatModelSettings) -> None:
        self.model = model
        self.name = model.name
        self.db = db
        self.settings = settings

    async def chat(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        tool_choice: str | dict[str, Any] | None = None,
        purpose: str = "chat",
    ) -> ChatResult:
        """One completion, once the tenant's budget has room for it (see ``spend``)."""
        run = current_run.get()
        if run is not None:
            await self.spend(run, purpose)
        return await self.model.chat(
            messages, tools=tools, tool_choice=tool_choice, purpose=purpose
        )

    async def spend(self, run: JobRun, purpose: str) -> None:
        """Count one call of the run's tenant. Past the budget (said in one log line per
        tenant and window), a run granted nothing yet is ``Deferred`` to the window's end,
        its worker's slot free meanwhile; one granted calls already waits for the window's
        end and asks again, so what it was granted is not spent twice (deferred, it would
        start over and ask for it again, and jobs that each need two calls of a window
        could take turns at one call each for ever)."""
        window = self.settings.budget_window_seconds
        while True:
            async with self.db.tenant(run.tenant_id) as session:
                tenant = await repository.get_tenant(session, run.tenant_id)
                overrides = dict(tenant.settings or {}) if tenant else {}
                limit = calls_per_minute(overrides, self.settings)
                spent = await repository.spend_llm_call(session, run.tenant_id, limit, window)
            if spent.granted:
                run.spent += 1
                return
            LLM_BUDGET_REACHED.labels(purpose).inc()
            if spent.refused == 1:
                log.warning(
                    "tenant %s reached its budget of %d LLM calls per %gs: its jobs wait"
                    " %.1fs, to the next window",
                    run.tenant_id,
                    limit,
                    window,
                    spent.wait_seconds,
                    extra={"fields": {"tenant_id": str(run.tenant_id), "llm_calls": limit}},
                )
            if not run.spent:
                raise Deferred(
                    f"the tenant's budget of {limit} LLM calls per {window:g}s is spent;"
                    f" the job runs again in {spent.wait_seconds:.1f}s",
                    delay=spent.wait_seconds,
                )
            await asyncio.sleep(max(spent.wait_seconds, 0.01))

    async def close(self) -> None:
        """Release the model's resources."""
        await self.model.close()


def budgeted(
    model: ChatModel | None, db: Database, settings: ChatModelSettings
) -> ChatModel | None:
    """``model`` with its calls counted against the tenants' budgets (None: no model)."""
    return BudgetedChat(model, db, settings) if model is not None else None
