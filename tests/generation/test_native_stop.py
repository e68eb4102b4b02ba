"""A native generation that is aborted ends only once its native work stopped, even when the
job is cancelled again while the abort is under way: the generation stage must not take the
next request while the worker still runs the aborted one (the second cancellation used to
end the job at once, in the middle of native SGLang's abort call)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from sglang_omni.contract.job import EngineSpec, Job
from sglang_omni.engines.native.generation import NativeGenerator
from sglang_omni.engines.native.generation_driver import NativeOutput


class BlockingDriver:
    """A native driver whose generation runs until it is aborted, and whose abort call
    returns when the test lets it."""

    def __init__(self) -> None:
        self.generating = threading.Event()
        self.abort_entered = threading.Event()
        self.abort_may_return = threading.Event()
        self.stopped = threading.Event()
        self.generation_returned = threading.Event()

    def native_abort(self) -> str | None:
        return "abort_request"

    def register_own_plugins(self) -> None:
        pass

    def start(self, server_kwargs: dict[str, Any]) -> None:
        pass

    def workers(self) -> list[Any]:
        return []

    def ffmpeg(self) -> str:
        return "ffmpeg"

    def generate(self, kwargs: dict[str, Any]) -> NativeOutput:
        self.generating.set()
        self.stopped.wait(60)
        self.generation_returned.set()
        return NativeOutput(None, "aborted")

    def generate_action(self, request: dict[str, Any], folder: str) -> dict[str, Any]:
        raise NotImplementedError

    def abort(self, request_id: str) -> None:
        self.abort_entered.set()
        self.abort_may_return.wait(60)
        self.stopped.set()  # native stops the generation just after its abort call returns

    def release(self) -> None:
        pass

    def shutdown(self) -> None:
        pass


def test_a_job_cancelled_again_during_the_abort_ends_after_its_generation(tmp_path: Path
                                                                           ) -> None:
    driver = BlockingDriver()
    spec = EngineSpec("generation", "generation", "native", None, None, None,
                      {"output_dir": str(tmp_path), "cancellation_plugin": False}, {})

    async def main() -> None:
        engine = NativeGenerator(spec, driver=driver)
        await engine.start()
        job = Job("r1", {"modality": "image", "prompt": "a cat", "options": {}}, [],
                  emit=lambda _chunk: None)
        run = asyncio.create_task(engine.run(job))
        assert await asyncio.to_thread(driver.generating.wait, 60)
        run.cancel()  # the client left
        assert await asyncio.to_thread(driver.abort_entered.wait, 60), "no native abort"
        run.cancel()  # again (the stage stops, say) while native SGLang's abort runs
        await asyncio.sleep(0)  # the second cancellation reaches the job
        assert not run.done(), "the job ended while native SGLang's abort still ran"
        driver.abort_may_return.set()
        with pytest.raises(asyncio.CancelledError):
            await run
        assert driver.generation_returned.is_set(), "the job ended before its generation"
        await engine.close()

    asyncio.run(main())
