"""The wire's connections and bytes: one thread's connection to a node, commands packed
into RESP and replies read."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis

_pack_command: Callable[[tuple[Any, ...]], bytes] | None
try:
    from hiredis import pack_command as _pack_command
except ImportError:  # pure-Python parser: let redis-py pack
    _pack_command = None


def pack(commands: list[tuple[Any, ...]]) -> list[bytes]:
    """RESP bytes of several commands, for Connection.send_packed_command."""
    if _pack_command is not None:
        return [b"".join(_pack_command(c) for c in commands)]
    return list(redis.Connection().pack_commands(commands))  # type: ignore[no-untyped-call]


def read_reply(conn: Any) -> Any:
    """The next reply on ``conn``; an error reply is returned, not raised."""
    try:
        return conn.read_response()
    except redis.ResponseError as exc:
        if "OOM command not allowed" in str(exc) and not isinstance(
                exc, redis.exceptions.OutOfMemoryError):
            # Redis before 7 reports a full Redis inside a script as a script error
            return redis.exceptions.OutOfMemoryError(str(exc))
        return exc


class ThreadConn:
    """One thread's own connection to ``node``."""

    def __init__(self, conn: Any, node: str) -> None:
        self.conn, self.node = conn, node

    def drop(self) -> None:
        """Disconnect after a fault (a half-read connection must not be reused as is): the
        next round trip reconnects it."""
        self.conn.disconnect()


class ThreadConns:
    """One thread's connections, by node. They are disconnected when the thread ends (its
    thread-local storage, and with it this object, is freed) or the wire closes: redis-py's
    connections sit in reference cycles, so a dropped one would keep its socket open until
    the cyclic collector found it."""

    def __init__(self) -> None:
        self.by_node: dict[str, ThreadConn] = {}

    def close(self) -> None:
        """Disconnect every connection (a later round trip reconnects)."""
        for conn in list(self.by_node.values()):
            conn.drop()

    def __del__(self) -> None:
        self.close()
