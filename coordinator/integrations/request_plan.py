"""What an LLM request asks for, read from its HTTP method, path and JSON body before it is
sent: the endpoint, the model, the input size, the output limit, whether it streams; and
the reservation that covers its worst case (pure: no I/O)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from ..core import pricing
from ..core.usage import is_model_name
from ..models import WrapOptions

# Path endings of the endpoints budgeted: (operation name per the GenAI conventions,
# provider). Any base URL (OpenAI-compatible servers, proxies) is matched by its ending.
ENDPOINTS: tuple[tuple[str, str, str], ...] = (
    ("/chat/completions", "chat", "openai"),
    ("/responses", "chat", "openai"),
    ("/embeddings", "embeddings", "openai"),
    ("/completions", "text_completion", "openai"),
    ("/messages", "chat", "anthropic"),
)
OUTPUT_FIELDS = ("max_completion_tokens", "max_output_tokens", "max_tokens")
"""Body fields naming the output limit (Chat Completions, Responses, Anthropic/legacy)."""
DOCUMENTED_OUTPUT_CAPS: dict[str, int] = {
    "gpt-4o": 16_384, "gpt-4o-mini": 16_384, "gpt-4.1": 32_768, "gpt-4.1-mini": 32_768,
    "gpt-4.1-nano": 32_768, "gpt-4-turbo": 4_096, "gpt-4": 8_192, "gpt-3.5-turbo": 4_096,
    "gpt-5": 128_000, "gpt-5-mini": 128_000, "gpt-5-nano": 128_000, "o1": 100_000,
    "o3": 100_000, "o3-mini": 100_000, "o4-mini": 100_000,
    "claude-3-5-haiku": 8_192, "claude-3-5-sonnet": 8_192, "claude-3-7-sonnet": 64_000,
    "claude-sonnet-4": 64_000, "claude-opus-4": 32_000, "claude-haiku-4-5": 64_000,
    "claude-sonnet-4-5": 64_000, "claude-opus-4-1": 32_000,
}
"""The providers' documented maximum output of common models (a request that names no
output limit may produce this much); longest matching prefix wins."""
UNKNOWN_MODEL_OUTPUT_CAP = 16_384
"""The output assumed for a model with no documented cap here (and no setting)."""


@dataclass(frozen=True)
class RequestPlan:
    """One budgeted request, as read from its body."""

    operation: str
    """``chat``, ``embeddings`` or ``text_completion`` (GenAI ``gen_ai.operation.name``)."""
    provider: str
    """``openai`` (any OpenAI-compatible server) or ``anthropic``."""
    model: str | None
    input_tokens: int
    """Input tokens estimated from the body: about four characters a token."""
    max_output_tokens: int
    """The output limit the request names, else the model's cap or the default setting."""
    limit_named: bool
    """Whether the request named its output limit (the provider enforces it then)."""
    stream: bool
    body: dict[str, Any]
    """The JSON body to send."""
    usage_added: bool
    """Whether ``stream_options.include_usage`` was added to a Chat Completions stream's
    body (the one change made to a body): its usage-only chunk is metered, not handed
    on to a caller who did not ask for it."""

    @property
    def estimate_usd(self) -> float:
        """The worst case: every input token plus the whole output limit, at the model's
        price (0 for a model without a known price: then only tokens are held)."""
        cost = pricing.price_usd(self.model, self.input_tokens, self.max_output_tokens,
                                 provider=self.provider)
        return cost or 0.0

    def options(self, operation_name: str | None = None) -> WrapOptions:
        """The wrap options that reserve this request's worst case."""
        return WrapOptions(
            operation_name=(operation_name or f"{self.operation} {self.model or ''}")[:100],
            cost_estimate_hint=self.estimate_usd, provider=self.provider, model=self.model,
            input_tokens_estimate=self.input_tokens, max_output_tokens=self.max_output_tokens)


def endpoint_of(method: str, path: str) -> tuple[str, str] | None:
    """(operation, provider) of a request to a known LLM endpoint, else None."""
    if method.upper() != "POST":
        return None
    path = path.rstrip("/")
    for ending, operation, provider in ENDPOINTS:
        if path.endswith(ending):
            return operation, provider
    return None


def output_cap(model: str | None, default_output_tokens: int | None) -> int:
    """The output a request without a limit may produce: the setting when given, else the
    model's documented cap."""
    if default_output_tokens is not None:
        return default_output_tokens
    if model:
        name = model.rsplit("/", 1)[-1].lower()
        best = max((p for p in DOCUMENTED_OUTPUT_CAPS if name.startswith(p)), key=len,
                   default=None)
        if best is not None:
            return DOCUMENTED_OUTPUT_CAPS[best]
    return UNKNOWN_MODEL_OUTPUT_CAP


def _text_size(value: Any) -> int:
    """Characters of text in a JSON value (strings anywhere, keys excluded)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(_text_size(v) for v in value.values())
    if isinstance(value, list):
        return sum(_text_size(v) for v in value)
    return 0


def estimate_input_tokens(body: dict[str, Any]) -> int:
    """Input tokens of a request body, on the high side: every string but the model name
    and the options at four characters a token, plus four a message."""
    text = {k: v for k, v in body.items() if k in ("messages", "input", "system", "tools",
                                                   "prompt", "instructions", "functions")}
    messages = body.get("messages")
    per_message = 4 * len(messages) if isinstance(messages, list) else 0
    return math.ceil(_text_size(text) / 4) + per_message


def plan_request(method: str, path: str, content: bytes, *,
                 default_output_tokens: int | None = None) -> RequestPlan | None:
    """The plan of a request to a known endpoint, or None (not an LLM request, or a body
    that is not a JSON object: sent as it is, unbudgeted)."""
    endpoint = endpoint_of(method, path)
    if endpoint is None:
        return None
    operation, provider = endpoint
    try:
        body = json.loads(content) if content else None
    except ValueError:
        return None
    if not isinstance(body, dict):
        return None
    return plan_body(body, operation, provider, default_output_tokens=default_output_tokens,
                     chat_stream=path.rstrip("/").endswith("/chat/completions"))


def plan_body(body: dict[str, Any], operation: str, provider: str, *,
              default_output_tokens: int | None = None,
              chat_stream: bool = False) -> RequestPlan:
    """The plan of a request body in the OpenAI or Anthropic shape (also what framework
    hooks build from a chat model's messages and parameters). ``chat_stream``: a Chat
    Completions body, whose stream is asked for its usage."""
    model = body.get("model") if is_model_name(body.get("model")) else None
    stream = body.get("stream") is True
    limit = next((body[f] for f in OUTPUT_FIELDS
                  if isinstance(body.get(f), int) and not isinstance(body.get(f), bool)
                  and body[f] >= 0), None)
    named = limit is not None
    if operation == "embeddings":
        limit, named = 0, True
    elif limit is None:
        limit = output_cap(model, default_output_tokens)
    added = False
    if stream and chat_stream:
        options = body.get("stream_options")
        if not isinstance(options, dict) or options.get("include_usage") is not True:
            # the final chunk then states the usage: the stream is charged what it used
            body = {**body, "stream_options": {**(options if isinstance(options, dict)
                                                  else {}), "include_usage": True}}
            added = True
    return RequestPlan(operation=operation, provider=provider, model=model,
                       input_tokens=estimate_input_tokens(body), max_output_tokens=limit,
                       limit_named=named, stream=stream, body=body, usage_added=added)
