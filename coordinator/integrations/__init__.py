"""Budget an existing agent in one line (docs/integrations.md).

``budgeted(OpenAI())`` (or ``AsyncOpenAI``, ``Anthropic``, ``AsyncAnthropic``) puts the
budget transport under an official SDK client: every request it sends to an LLM endpoint
is a wrapped call of the current context, reserved from the request's body before it is
sent and settled from the response's usage. Needs the ``openai`` or ``anthropic`` extra
(httpx2). The framework hooks are in ``pydantic_ai``, ``langchain`` and ``openai_agents``
(each needs its own extra, and is imported only by name).
"""

from __future__ import annotations

from .async_transport import AsyncBudgetTransport
from .errors import BudgetExceededError
from .prepare import TransportSettings
from .sdk import budgeted
from .transport import BudgetTransport

__all__ = ["AsyncBudgetTransport", "BudgetExceededError", "BudgetTransport",
           "TransportSettings", "budgeted"]
