"""A real LiteLLM proxy process (``litellm --config``) on a free port, in front of the
local provider, its budget hook's coordinator on the test's Redis."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from coordinator.embedded import free_port
from tests.support.fake_provider import ProviderServer
from tests.support.procs import TEST_KEYS

ROOT = Path(__file__).resolve().parents[2]
MASTER_KEY = "sk-" + "budget-test-proxy-key-0123456789abcdef"


@contextmanager
def litellm_proxy(config: str, server: ProviderServer, redis_url: str,
                  folder: Path) -> Iterator[str]:
    """The proxy's URL, serving ``config`` (its ``config.yaml`` text) until the block
    ends; it reaches the provider through ``OPENAI_BASE_URL``."""
    path = folder / "config.yaml"
    path.write_text(config)
    port = free_port()
    env = dict(os.environ, BUDGET_REDIS_URL=redis_url, LITELLM_LOCAL_MODEL_COST_MAP="True",
               BUDGET_TOKEN_KEYS="test:" + TEST_KEYS["test"].decode(),
               OPENAI_BASE_URL=server.openai_url, OPENAI_API_KEY="k",
               LITELLM_MASTER_KEY=MASTER_KEY, PYTHONPATH=str(ROOT))
    log_path = folder / "proxy.log"
    log = log_path.open("w")
    proc = subprocess.Popen([str(Path(sys.executable).with_name("litellm")), "--config",
                             str(path), "--host", "127.0.0.1", "--port", str(port)],
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, "the proxy did not start"
            try:
                urllib.request.urlopen(f"{url}/health/liveliness", timeout=2).close()
                break
            except OSError:
                time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
