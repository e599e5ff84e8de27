"""Pub/sub channels: the stop broadcasts a process listens to and the ledger events an
exporter follows."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .topology import Client


class StopSubscription:
    """A subscription to a tenant's abort channel, read by polling."""

    def __init__(self, client: Client, channel: str) -> None:
        self._pubsub = client.pubsub(  # type: ignore[no-untyped-call]
            ignore_subscribe_messages=True)
        self._channel = channel

    def subscribe(self) -> None:
        self._pubsub.subscribe(self._channel)

    def poll(self, timeout: float) -> Any:
        """The next message's data, or None after ``timeout`` seconds."""
        msg = self._pubsub.get_message(timeout=timeout)
        return msg.get("data") if msg is not None else None

    def close(self) -> None:
        self._pubsub.close()


def wake(client: Client, channel: str) -> None:
    """Publish an empty message on ``channel`` (wakes a listener from its blocking read;
    listeners ignore it)."""
    client.publish(channel, "")


class ChannelThread:
    """A background thread handing every message published on one channel to a
    handler (redis-py's pub/sub worker thread)."""

    def __init__(self, client: Client, channel: str,
                 on_message: Callable[[Mapping[str, Any]], None],
                 on_error: Callable[[BaseException, Any, Any], None]) -> None:
        self._pubsub = client.pubsub(  # type: ignore[no-untyped-call]
            ignore_subscribe_messages=True)
        self._pubsub.subscribe(**{channel: on_message})
        self._thread = self._pubsub.run_in_thread(sleep_time=0.5, daemon=True,
                                                  exception_handler=on_error)

    def close(self) -> None:
        """Stop the thread and close its connection."""
        self._thread.stop()
        self._thread.join(timeout=5)
        self._pubsub.close()
