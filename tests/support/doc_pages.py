"""The harness of tests/docs/test_docs.py: a page's code blocks, and a runner that types its
Python blocks into one console (tests/support/doc_console.py), writes its file blocks, and runs
its bash commands (serving ones in the background) in one folder, against the Redis the
environment names."""

from __future__ import annotations

import json
import os
import re
import select
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from coordinator.embedded import RedisServer

ROOT = Path(__file__).resolve().parents[2]
OWN_TEST = {"docs/integrations.md": "tests/docs/test_integrations_docs.py types its examples with "
                                    "the SDKs pointed at the local provider",
            "docs/degrade.md": "tests/docs/test_degrade_docs.py types its examples with the "
                               "SDKs pointed at the local provider"}
"""Pages whose examples need a service the docs cannot start: run by a test of their own."""
PAGES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")
                              if str(p.relative_to(ROOT)) not in OWN_TEST)]
BIN = Path(sys.executable).parent
BLOCK_TIMEOUT_S = 60
TOKEN_KEYS = "docs:docs-secret-0123456789abcdef"

SERVING = [re.compile(r"^celery -A \S+ worker\b"), re.compile(r"^budgetctl dashboard\b")]


@dataclass
class Block:
    page: str
    line: int
    lang: str
    text: str


def blocks_of(page: str) -> list[Block]:
    """The fenced code blocks of a page, in order."""
    found = []
    text = (ROOT / page).read_text()
    for m in re.finditer(r"^```(\w*)[^\n]*\n(.*?)^```", text, flags=re.S | re.M):
        found.append(Block(page, text[:m.start()].count("\n") + 1, m.group(1), m.group(2)))
    return found


def commands_of(block: Block) -> list[str]:
    """A bash block's commands: continuation lines joined, comments and blank lines out."""
    joined = block.text.replace("\\\n", " ")
    commands = []
    for line in joined.splitlines():
        command = line.split(" #", 1)[0].strip() if not line.lstrip().startswith("#") else ""
        if command:
            commands.append(command)
    return commands


def printed_values(text: str) -> list[str]:
    """What a block says its ``print`` lines show: ``print(x)  # 0.024: why`` -> ``0.024``."""
    return [m.group(1).strip() for m in
            re.finditer(r"^[ \t]*print\(.*\)[ \t]+# ([^:(\n]+)", text, flags=re.M)]


FILE_BLOCK = re.compile(r"^# (\w+\.py)\b")


class Page:
    """One page's folder, console and background commands."""

    def __init__(self, page: str, folder: Path, env: dict[str, str]) -> None:
        self.page, self.folder, self.env = page, folder, env
        self.console: subprocess.Popen[str] | None = None
        self.serving: list[tuple[subprocess.Popen[bytes], Path]] = []

    def run_blocks(self, skip: Callable[[str], str | None]) -> None:
        """Every block of the page, in order; ``skip(text)`` says why a block (a command,
        in a bash block) is not run (None: it runs)."""
        for block in blocks_of(self.page):
            if block.lang != "bash" and skip(block.text):
                continue
            if block.lang == "json":
                json.loads(block.text)
            elif block.lang == "python":
                named = FILE_BLOCK.match(block.text)
                if named:
                    (self.folder / named.group(1)).write_text(block.text)
                else:
                    self.type_in(block)
            elif block.lang == "bash":
                for command in commands_of(block):
                    if not skip(command):
                        self.run(block, command)
            else:
                assert block.lang in ("", "text"), f"{self.page}:{block.line}: {block.lang}?"

    def type_in(self, block: Block) -> str:
        """Type ``block`` into the page's console; what it printed."""
        if self.console is None:
            self.console = subprocess.Popen(
                [sys.executable, "-m", "tests.support.doc_console"], cwd=self.folder, env=self.env,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.console.stdin and self.console.stdout
        self.console.stdin.write(json.dumps({"code": block.text}) + "\n")
        self.console.stdin.flush()
        ready, _, _ = select.select([self.console.stdout], [], [], BLOCK_TIMEOUT_S)
        assert ready, f"{block.page}:{block.line} still runs after {BLOCK_TIMEOUT_S} s"
        reply = self.console.stdout.readline()
        assert reply, f"{block.page}:{block.line}: the console exited"
        said = json.loads(reply)
        where = f"{block.page}:{block.line}"
        assert not said["failed"], f"{where} failed:\n{said['err']}"
        assert not said["pending"], f"{where} leaves a statement unfinished"
        printed = iter(said["out"].splitlines())
        for expected in printed_values(block.text):
            assert any(line.strip() == expected for line in printed), \
                f"{where} should print {expected!r}:\n{said['out']}"
        return str(said["out"])

    def run(self, block: Block, command: str) -> None:
        where = f"{block.page}:{block.line} `{command}`"
        if any(p.match(command) for p in SERVING):
            self.serve(command, where)
            return
        done = subprocess.run(["bash", "-c", command], cwd=self.folder, env=self.env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"{where} exited {done.returncode}:\n{done.stdout}" \
                                     f"\n{done.stderr}"

    def serve(self, command: str, where: str) -> None:
        log = self.folder / f"serving-{len(self.serving)}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(shlex.split(command), cwd=self.folder, env=self.env,
                                    stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        self.serving.append((proc, log))
        deadline = time.monotonic() + 60
        while not re.search(r" ready\.|Uvicorn running|Application startup complete",
                            log.read_text(errors="replace")):
            assert proc.poll() is None, f"{where} exited:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"{where} not ready:\n{log.read_text()}"
            time.sleep(0.1)

    def close(self) -> None:
        if self.console is not None:
            assert self.console.stdin
            self.console.stdin.close()
            try:
                self.console.wait(30)
            except subprocess.TimeoutExpired:
                self.console.kill()
                self.console.wait()
            assert self.console.stdout
            self.console.stdout.close()
        for proc, _ in self.serving:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc, _ in self.serving:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def page_env(server: RedisServer, folder: Path) -> dict[str, str]:
    base = f"redis://127.0.0.1:{server.port}"
    return {**os.environ,
            "BUDGET_REDIS_URL": f"{base}/0", "CELERY_BROKER_URL": f"{base}/1",
            "CELERY_RESULT_BACKEND": f"{base}/2", "BUDGET_TOKEN_KEYS": TOKEN_KEYS,
            "PYTHONPATH": str(ROOT),
            "PATH": os.pathsep.join([str(BIN), os.environ.get("PATH", "")])}


