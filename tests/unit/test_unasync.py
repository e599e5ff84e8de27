"""Each generated sync twin (tests/support/unasync.py) is what its async source generates
now: edit the source and forget to regenerate, and this fails."""

from __future__ import annotations

from tests.support.unasync import stale, unasync


def test_generated_twins_are_up_to_date() -> None:
    assert stale() == [], "run `python -m tests.support.unasync` and commit what it writes"


def test_unasync_drops_await_and_renames_async_names() -> None:
    source = ("from .x import asend_request, exchange_for\n"
              "async def aclose(self) -> None:\n"
              "    async for c in await self.stream.__aiter__():\n"
              "        await asend_request(c)\n")
    assert unasync(source, "a.py").splitlines()[2:] == [
        "from .x import exchange_for, send_request",
        "def close(self) -> None:",
        "    for c in self.stream.__iter__():",
        "        send_request(c)"]

