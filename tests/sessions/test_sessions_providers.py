"""The sandbox provider contract, passed by the local provider here and by the E2B
provider against E2B when E2B_API_KEY is set; and the E2B result mapping."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from coordinator.sessions import LocalKernelProvider, SandboxLostError, SandboxProvider
from coordinator.sessions.providers.base import OutputBuffer

LABELS = {"tenant_id": "acme", "conversation_id": "c1", "path_id": "main"}


@pytest.fixture(params=["local", "e2b"])
def provider(request: pytest.FixtureRequest, short_tmp: Path) -> Iterator[SandboxProvider]:
    if request.param == "local":
        local = LocalKernelProvider(short_tmp / "k")
        yield local
        local.close()
        return
    if not os.environ.get("E2B_API_KEY"):
        pytest.skip("E2B_API_KEY is not set: the E2B provider runs the contract against "
                    "E2B only with a key (its result mapping is tested below)")
    pytest.importorskip("e2b_code_interpreter", reason="the e2b extra is not installed")
    from coordinator.sessions.providers.e2b import E2BProvider
    yield E2BProvider()


def test_provider_contract(provider: SandboxProvider) -> None:
    sandbox = provider.create(LABELS, timeout_s=60, ttl_s=120, template="base")
    info = sandbox.info
    try:
        assert info.sandbox_id
        first = sandbox.run("a = 2\nprint(a * 21)", "python", timeout_s=30,
                            max_output_chars=1000)
        assert first.output == "42\n" and first.error is None and not first.truncated
        assert sandbox.run("a + 1", "python", timeout_s=30,
                           max_output_chars=1000).output.strip() == "3"
        failed = sandbox.run("1 / 0", "python", timeout_s=30, max_output_chars=1000)
        assert (failed.error or "").startswith("ZeroDivisionError")
        cut = sandbox.run("print('x' * 5000)", "python", timeout_s=30, max_output_chars=64)
        assert cut.truncated and cut.output == "x" * 64
        slow = sandbox.run("import time\ntime.sleep(60)", "python", timeout_s=1,
                           max_output_chars=1000)
        assert slow.timed_out
        # Another handle on the same sandbox (by its record) sees the same state.
        again = provider.connect(info)
        assert again.run("print(a)", "python", timeout_s=30,
                         max_output_chars=1000).output.strip() == "2"
    finally:
        assert provider.kill(info)
    with pytest.raises(SandboxLostError):
        provider.connect(info)


def test_output_buffer_cuts_at_the_limit() -> None:
    buf = OutputBuffer(5)
    for part in ("ab", "cd", "ef", "gh"):
        buf.add(part)
    assert buf.text() == "abcde" and buf.truncated


def test_e2b_execution_mapping() -> None:
    models = pytest.importorskip("e2b_code_interpreter.models",
                                 reason="the e2b extra is not installed")
    from coordinator.sessions.providers.e2b import execution_to_output

    ok = models.Execution(results=[models.Result(text="3", is_main_result=True)],
                          logs=models.Logs(stdout=["hi\n"], stderr=["warn\n"]))
    out = execution_to_output(ok, 1000)
    assert out.output == "hi\nwarn\n3\n" and out.error is None and not out.truncated
    data = models.Execution(results=[models.Result(text="{...}", json={"k": 1},
                                                   is_main_result=True)])
    assert execution_to_output(data, 1000).json_result
    assert execution_to_output(data, 1000).output == '{"k": 1}\n'
    failed = models.Execution(error=models.ExecutionError("NameError", "name 'q' is not "
                                                          "defined", "Traceback ..."))
    mapped = execution_to_output(failed, 1000)
    assert mapped.error == "NameError: name 'q' is not defined\nTraceback ..."
    stopped = models.Execution(error=models.ExecutionError("KeyboardInterrupt", "", ""))
    assert execution_to_output(stopped, 1000).interrupted
    long = models.Execution(logs=models.Logs(stdout=["y" * 100]))
    cut = execution_to_output(long, 10)
    assert cut.truncated and cut.output == "y" * 10
