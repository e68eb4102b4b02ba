"""Realtime sessions at shutdown: ``Sessions.close`` cancels those running, and a session that
starts after it (a realtime video session waits up to 5 s for the slot) is refused instead of
running on unowned."""

from __future__ import annotations

import asyncio

from sglang_omni.pipeline.admission.realtime import Sessions


def test_a_session_entering_after_close_is_refused() -> None:
    async def scenario() -> None:
        sessions = Sessions()
        cancelled = asyncio.Event()

        async def session() -> None:
            assert sessions.enter()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.set()
                raise
            finally:
                sessions.leave()

        running = asyncio.create_task(session())
        await asyncio.sleep(0)
        await asyncio.wait_for(sessions.close(), 5)
        assert cancelled.is_set() and running.done()

        async def late() -> bool:
            return sessions.enter()

        assert await asyncio.create_task(late()) is False
        assert sessions.tasks == set()

    asyncio.run(scenario())
