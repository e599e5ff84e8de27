"""The request the SDK transport sends (pure): a stream is always asked uncompressed; its
body is rewritten only when the usage had to be asked for, else the request is kept."""

from __future__ import annotations

import json

import httpx2

from coordinator.integrations.prepare import TransportSettings, prepare

URL = "https://api.openai.com/v1/chat/completions"


def _request(body: dict[str, object]) -> httpx2.Request:
    return httpx2.Request("POST", URL, content=json.dumps(body).encode(),
                          headers={"accept-encoding": "gzip, deflate", "x-other": "1"})


def test_a_stream_that_asks_its_usage_keeps_its_request() -> None:
    request = _request({"model": "gpt-4o", "messages": [], "stream": True,
                        "stream_options": {"include_usage": True}})
    content = request.content
    prepared = prepare(request, TransportSettings())
    assert prepared is not None
    plan, sent = prepared
    assert sent is request and not plan.usage_added
    assert sent.content == content
    assert sent.headers.get_list("accept-encoding") == ["identity"]
    assert sent.headers["content-length"] == str(len(content))
    assert sent.headers["x-other"] == "1"


def test_a_stream_without_usage_is_rebuilt_with_it() -> None:
    request = _request({"model": "gpt-4o", "messages": [], "stream": True})
    prepared = prepare(request, TransportSettings())
    assert prepared is not None
    plan, sent = prepared
    assert sent is not request and plan.usage_added
    assert json.loads(sent.content)["stream_options"] == {"include_usage": True}
    assert sent.headers.get_list("accept-encoding") == ["identity"]
    assert sent.headers["content-length"] == str(len(sent.content))
    assert sent.headers["x-other"] == "1"


def test_a_request_that_does_not_stream_goes_as_it_is() -> None:
    request = _request({"model": "gpt-4o", "messages": []})
    prepared = prepare(request, TransportSettings())
    assert prepared is not None and prepared[1] is request
    assert request.headers["accept-encoding"] == "gzip, deflate"
