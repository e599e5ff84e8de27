"""An interactive console that tests/docs/test_docs.py types a page's Python blocks into.

Run as a process of its own (``python -m tests.support.doc_console``): it reads one JSON request a
line on stdin, ``{"code": text}``, and types ``text`` line by line into one
``code.InteractiveConsole`` as a reader would (a blank line ends a compound statement;
the console keeps its names from one block to the next). It answers one JSON line,
``{"out": ..., "err": ..., "failed": bool, "pending": bool}``: what the block printed,
its tracebacks, whether one was shown, and whether a statement was left unfinished.
"""

from __future__ import annotations

import code
import contextlib
import io
import json
import sys


class _Console(code.InteractiveConsole):
    """Notes each traceback it shows."""

    failed = False

    def showtraceback(self) -> None:
        self.failed = True
        super().showtraceback()

    def showsyntaxerror(self, filename: str | None = None, **kwargs: object) -> None:
        self.failed = True
        super().showsyntaxerror(filename)


def main() -> None:
    console = _Console(filename="<doc>")
    replies = sys.stdout
    for request in sys.stdin:
        text = json.loads(request)["code"]
        out, err = io.StringIO(), io.StringIO()
        console.failed = False
        pending = False
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            for line in [*text.splitlines(), ""]:
                pending = console.push(line)
        replies.write(json.dumps({"out": out.getvalue(), "err": err.getvalue(),
                                  "failed": console.failed, "pending": pending}) + "\n")
        replies.flush()


if __name__ == "__main__":
    main()
