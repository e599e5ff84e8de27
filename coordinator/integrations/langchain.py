"""LangChain and LangGraph (extra ``langchain``): ``BudgetCallbackHandler`` makes every
tool run a wrapped tool call (and, with ``chat_models=True``, every chat model run a
wrapped LLM call, for models whose client the transport does not cover; such a call that
its context's model ladder moves to another model is refused with DEGRADE, since the
handler cannot switch the model), driven by the call's own steps between the run's start
and end callbacks; ``budgeted_chat_model`` puts the transport under a ``ChatOpenAI`` (its
requests run on the model the ladder chose); ``run_graph`` runs a graph (or any runnable)
in a child context named after it."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import BaseMessage
from langchain_core.outputs import LLMResult

from ..context import tracing
from ..context.call import Call, Outcome, begin, finish, node
from ..context.execution import ExecutionContext, current_context
from ..context.executor import Executor
from ..context.settling import complete, fail
from ..context.steps import drive
from ..core.vocabulary import EdgeEvent, FinishOutcome, NodeStatus
from ..models import Decision, WrapOptions
from .agents import agent_context
from .errors import BudgetExceededError
from .request_plan import OUTPUT_FIELDS, plan_body
from .sdk import budgeted


class BudgetCallbackHandler(BaseCallbackHandler):
    """Budgets the runs it hears of under ``context`` (default: the current context when
    a run starts). A refused run raises :class:`BudgetExceededError` from its start
    callback (``raise_error``), so the tool or model never runs."""

    raise_error = True
    run_inline = True

    def __init__(self, context: ExecutionContext | None = None, *, chat_models: bool = False,
                 default_output_tokens: int | None = None) -> None:
        self.context = context
        self.chat_models = chat_models
        self.default_output_tokens = default_output_tokens
        self._runs: dict[UUID, tuple[Call, Any]] = {}

    # -- tools ---------------------------------------------------------------------------

    def on_tool_start(self, serialized: dict[str, Any], input_str: str, *, run_id: UUID,
                      **kwargs: Any) -> None:
        name = (serialized or {}).get("name") or kwargs.get("name") or "tool"
        self._begin(run_id, "tool", WrapOptions(operation_name=f"tool {name}"[:100]))

    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._end(run_id, None)

    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._end(run_id, None, error)

    # -- chat models (when the transport does not cover their client) --------------------

    def on_chat_model_start(self, serialized: dict[str, Any],
                            messages: list[list[BaseMessage]], *, run_id: UUID,
                            invocation_params: dict[str, Any] | None = None,
                            **kwargs: Any) -> None:
        if not self.chat_models:
            return
        params = invocation_params or {}
        body: dict[str, Any] = {
            "model": params.get("model") or params.get("model_name"),
            "messages": [{"content": str(m.content)} for batch in messages for m in batch]}
        body.update({f: params[f] for f in OUTPUT_FIELDS if f in params})
        provider = "anthropic" if "anthropic" in str(params.get("_type", "")) else "openai"
        plan = plan_body(body, "chat", provider,
                         default_output_tokens=self.default_output_tokens)
        self._begin(run_id, "llm", plan.options())

    def on_llm_end(self, response: LLMResult, *, run_id: UUID, **kwargs: Any) -> None:
        if run_id in self._runs:
            self._end(run_id, _usage_of(response))

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        if run_id in self._runs:
            self._end(run_id, None, error)

    # -- the call's steps ----------------------------------------------------------------

    def _begin(self, run_id: UUID, kind: str, options: WrapOptions) -> None:
        ctx = self.context if self.context is not None else current_context()
        if ctx is None:
            return
        state = ctx._state
        span = tracing.start_span(state, kind, options)
        started = drive(begin(state, ctx, "tool" if kind == "tool" else "llm", options),
                        Executor(state))
        if isinstance(started, Call) and started.degraded_from is not None:
            started = _not_switched(started)
        if isinstance(started, Outcome):
            tracing.end_span(span, state, decision=started.decision.value,
                             reason=started.reason, settled=None)
            raise BudgetExceededError(decision=started.decision,
                                      reason=started.reason or started.decision.value,
                                      detail=started.detail, chain_id=ctx.chain_id,
                                      snapshot=None)
        self._runs[run_id] = (started, span)

    def _end(self, run_id: UUID, result: Any, error: BaseException | None = None) -> None:
        entry = self._runs.pop(run_id, None)
        if entry is None:
            return
        call, span = entry
        execute = Executor(call.state)
        outcome = drive(fail(call, error), execute) if error is not None else drive(
            complete(call, result), execute)
        tracing.end_span(span, call.state, decision=outcome.decision.value if outcome
                         else "ERROR", reason=outcome.reason if outcome else None,
                         settled=call.settled, error=error)


def _not_switched(call: Call) -> Outcome:
    """A chat model call its context's ladder moved to another model: the handler hears
    the run once its model is chosen and cannot switch it, so the call does not run (its
    hold is given back): DEGRADE, naming the model to call instead."""
    record = node(call, NodeStatus.HALTED)
    record["stop_reason"] = EdgeEvent.DEGRADED
    drive(finish(call, FinishOutcome.SKIP, record, [], write_behind=True),
          Executor(call.state))
    return Outcome(Decision.DEGRADE, reason=EdgeEvent.DEGRADED,
                   detail=f"the model ladder chose {call.model} for {call.degraded_from}: "
                          f"call {call.model}, or put the transport under the model's "
                          f"client (budgeted_chat_model), which switches it")


def _usage_of(response: LLMResult) -> dict[str, Any] | None:
    """The usage a chat model's result states, in the OpenAI response shape."""
    output = response.llm_output or {}
    usage = output.get("token_usage") or output.get("usage")
    model = output.get("model_name") or output.get("model")
    if usage is None:
        for generations in response.generations:
            for generation in generations:
                meta = getattr(getattr(generation, "message", None), "usage_metadata", None)
                if meta:
                    usage = {"input_tokens": meta.get("input_tokens", 0),
                             "output_tokens": meta.get("output_tokens", 0)}
    if usage is None:
        return None
    return {"usage": dict(usage), "model": model}


def budgeted_chat_model(model: Any, **options: Any) -> Any:
    """Put the transport under a ``ChatOpenAI`` (its sync and async clients): every request
    it sends is budgeted under the current context. Returns the model."""
    for name in ("root_client", "root_async_client"):
        client = getattr(model, name, None)
        if client is not None:
            budgeted(client, **options)
    return model


def run_graph(graph: Any, graph_input: Any, *, name: str | None = None,
              context: ExecutionContext | None = None, config: dict[str, Any] | None = None,
              max_cost_usd: float | None = None) -> Any:
    """``graph.invoke(graph_input)`` in a child context named after the graph (``name``,
    or the graph's own), with a :class:`BudgetCallbackHandler` among its callbacks."""
    label = name or getattr(graph, "name", None) or "graph"
    run_config = dict(config or {})
    run_config["callbacks"] = [*list(run_config.get("callbacks") or []),
                               BudgetCallbackHandler()]
    with agent_context(label, context, max_cost_usd=max_cost_usd):
        return graph.invoke(graph_input, config=run_config)
