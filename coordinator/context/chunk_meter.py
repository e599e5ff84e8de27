"""ChunkMeter: the usage of one streamed provider response read from its chunks (stated by
the provider where it says so, estimated from the text in between), in the OpenAI Chat
Completions, OpenAI Responses, Anthropic Messages and LiteLLM shapes, SDK objects or
plain dicts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..core.usage import Usage, count, field, tokens_from_usage

# Responses API delta events that carry generated text (audio deltas are base64, not text).
_TEXT_DELTAS = ("text.delta", "refusal.delta", "arguments.delta")
# Where each Anthropic content delta carries its text (signature deltas carry none).
_ANTHROPIC_DELTA_TEXT = {"text_delta": "text", "input_json_delta": "partial_json",
                         "thinking_delta": "thinking"}
_RESPONSE_DONE = ("response.completed", "response.incomplete", "response.failed")


def text_delta_content(chunk: Any) -> str | None:
    """The text of a Chat Completions chunk (a plain dict) that :meth:`ChunkMeter.observe`
    reads as its ``model`` and its one choice's ``delta.content`` alone (no usage, no other
    text, no tool call): ``observe_text(chunk.get("model"), text)`` meters it the same.
    None for any other chunk."""
    if type(chunk) is not dict or "type" in chunk or chunk.get("usage") is not None:
        return None
    choices = chunk.get("choices")
    if type(choices) is not list or len(choices) != 1 or type(choices[0]) is not dict:
        return None
    delta = choices[0].get("delta")
    if type(delta) is not dict or delta.get("refusal") or delta.get("reasoning_content") \
            or delta.get("tool_calls"):
        return None
    content = delta.get("content")
    return content if isinstance(content, str) else None


def estimate_tokens(text: str) -> int:
    """Output tokens of a chunk of text, on the high side: about four characters a token,
    and at least one (OpenAI streams about one token per chunk)."""
    return (len(text) + 3) // 4 or 1  # max(1, ceil(len / 4)) in integers


class ChunkMeter:
    """Usage of one stream from its chunks: stated by the provider where it says so,
    estimated from the text in between (the SDK transport meters SSE events with it)."""

    def __init__(self, input_tokens: int | None, count_tokens: Callable[[str], int],
                 provider: str | None, model: str | None) -> None:
        self.input_estimate = input_tokens
        self.count_tokens = count_tokens
        self.provider = provider
        self.model = model
        self.stated: Usage | None = None  # the provider's latest full count
        # Anthropic reports its counters apart (message_start, then message_delta).
        self.anthropic: dict[str, int] = {}
        self.estimated_output = 0  # text tokens seen since the last stated output count
        # the running figures, kept as they change (read after every chunk)
        self._stated_output = 0
        self.output_tokens: int = 0
        """The stated output count plus the text estimated since."""
        self.input_tokens: int = input_tokens or 0
        """The stated input count (when the provider stated one), else the estimate."""

    def observe(self, chunk: Any) -> None:
        if type(chunk) is dict and "type" not in chunk:
            self._chat_dict(chunk)  # a Chat Completions chunk as JSON: the fast path
            return
        kind = field(chunk, "type")
        if kind == "message_start":
            message = field(chunk, "message")
            self._anthropic(field(message, "usage"))
            self._model(field(message, "model"))
        elif kind == "message_delta":
            self._anthropic(field(chunk, "usage"))
        elif kind == "content_block_delta":
            delta = field(chunk, "delta")
            name = _ANTHROPIC_DELTA_TEXT.get(field(delta, "type"))
            if name is not None:
                self._text(field(delta, name))
        elif isinstance(kind, str) and kind in _RESPONSE_DONE:
            response = field(chunk, "response")
            self._model(field(response, "model"))
            self._stated(field(response, "usage"))
        elif isinstance(kind, str) and kind.startswith("response."):
            if kind.endswith(_TEXT_DELTAS):
                self._text(field(chunk, "delta"))
        else:  # Chat Completions chunk (OpenAI, LiteLLM, OpenAI-compatible servers)
            self._model(field(chunk, "model"))
            for choice in field(chunk, "choices") or ():
                delta = field(choice, "delta")
                if delta is None:
                    continue
                for name in ("content", "refusal", "reasoning_content"):
                    self._text(field(delta, name))
                for call in field(delta, "tool_calls") or ():
                    self._text(field(field(call, "function"), "arguments"))
            self._stated(field(chunk, "usage"))

    def observe_text(self, model: Any, text: str) -> None:
        """:meth:`observe` of a chunk :func:`text_delta_content` reads as ``text``."""
        if self.model is None:
            self._model(model)
        if text:  # _text's work, the text known to be a string
            self.estimated_output += self.count_tokens(text)
            self.output_tokens = self._stated_output + self.estimated_output

    def _chat_dict(self, chunk: dict[str, Any]) -> None:
        """The Chat Completions branch of :meth:`observe` for a plain dict."""
        if self.model is None:
            self._model(chunk.get("model"))
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") if type(choice) is dict else None
            if type(delta) is not dict:
                continue
            for name in ("content", "refusal", "reasoning_content"):
                text = delta.get(name)
                if text:
                    self._text(text)
            for call in delta.get("tool_calls") or ():
                self._text(field(field(call, "function"), "arguments"))
        usage = chunk.get("usage")
        if usage is not None:
            self._stated(usage)

    def _model(self, model: Any) -> None:
        if isinstance(model, str) and model and self.model is None:
            self.model = model

    def _text(self, text: Any) -> None:
        if isinstance(text, str) and text:
            self.estimated_output += self.count_tokens(text)
            self.output_tokens = self._stated_output + self.estimated_output

    def _stated(self, usage: Any) -> None:
        if usage is None:
            return
        tokens = tokens_from_usage(usage)
        if tokens.has_tokens:
            self.stated = tokens
            self.estimated_output = 0
            self._restate()

    def _anthropic(self, usage: Any) -> None:
        if usage is None:
            return
        # message_delta counts are cumulative: each stated value replaces the last one.
        for name in ("input_tokens", "output_tokens", "cache_read_input_tokens",
                     "cache_creation_input_tokens"):
            value = count(field(usage, name))
            if value is not None:
                self.anthropic[name] = value
        if "output_tokens" in self.anthropic:
            self.estimated_output = 0
        a = self.anthropic
        self.stated = tokens_from_usage({
            "input_tokens": a.get("input_tokens", 0), "output_tokens": a.get("output_tokens", 0),
            "cache_read_input_tokens": a.get("cache_read_input_tokens", 0),
            "cache_creation_input_tokens": a.get("cache_creation_input_tokens", 0)})
        self._restate()

    def _restate(self) -> None:
        """Recompute the running figures from the stated count and the estimate."""
        stated = self.stated
        self._stated_output = stated.output_tokens if stated else 0
        self.output_tokens = self._stated_output + self.estimated_output
        self.input_tokens = stated.input_tokens if stated is not None and (
            stated.input_tokens) else self.input_estimate or 0

    def usage(self) -> Usage:
        stated = self.stated
        if stated is not None and stated.input_tokens:
            cread, cwrite = stated.cache_read_input_tokens, stated.cache_creation_input_tokens
        else:
            cread, cwrite = 0, 0
        return Usage(input_tokens=self.input_tokens, output_tokens=self.output_tokens,
                     model=self.model, provider=self.provider,
                     cache_read_input_tokens=cread, cache_creation_input_tokens=cwrite)
