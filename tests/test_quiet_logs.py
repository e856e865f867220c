"""A normal run logs no ERROR: refused calls leave nothing half-done for the event loop to
complain about, and ``serve`` speaks one format and says where it is."""

from __future__ import annotations

import asyncio
import gc
import logging
from typing import Any

import pytest

from tests.conftest import ADMIN, AppClient


async def test_refused_admin_calls_leave_nothing_for_the_event_loop_to_clean_up(
    client: AppClient, caplog: pytest.LogCaptureFixture
) -> None:
    loop = asyncio.get_running_loop()
    problems: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: problems.append(context))
    wrong = {"Authorization": "Bearer not-the-admin-token"}
    try:
        with caplog.at_level(logging.ERROR):
            for _ in range(3):
                answers = await asyncio.gather(
                    *(client.get("/admin/tenants", headers=wrong) for _ in range(30)),
                    *(client.get("/admin/tenants", headers=ADMIN) for _ in range(10)),
                )
                assert sorted(a.status_code for a in answers) == [200] * 10 + [401] * 30
            # What the loop would find later: abandoned generators are closed when collected.
            gc.collect()
            await asyncio.sleep(0.2)
            gc.collect()
            await asyncio.sleep(0.2)
    finally:
        loop.set_exception_handler(previous)
    assert [str(p.get("exception") or p.get("message")) for p in problems] == []
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
