"""``budgetctl tree``: a context's subtree, spend against each ceiling, why each
context under a stop halts, and the newest calls and events under it."""

from __future__ import annotations

import io
from typing import Annotated, Any

import typer
from rich.console import Console, Group, RenderableType
from rich.text import Text
from rich.tree import Tree

from ..runtime.coordinator import Coordinator
from ._common import JsonOption, WatchOption, connect, print_json, show
from .calls import DEFAULT_CALLS, CallLine, read_calls
from .events import EventLine, read_events
from .help_format import PlainCommand, PlainGroup
from .reads import Located, locate, read_tree
from .rows import Node, Row, plural, usd

app = typer.Typer(cls=PlainGroup)


def line(r: Row) -> Text:
    """One context: name, full id, spend against its ceiling, calls (and how many its
    model ladder degraded), state."""
    if r.status == "expired":
        return Text(f"{r.name} {r.id}  (expired)")
    pct = f" {100 * r.fraction:3.0f}%" if r.limit else ""
    held = f" (+{usd(r.held)} reserved)" if r.held else ""
    style = "red" if r.stop else "green" if r.status == "running" else ""
    degraded = f" ({r.degraded:,} degraded)" if r.degraded else ""
    return Text.assemble(
        (r.name, "bold"), " ", (r.id, "cyan"),
        f"  {usd(r.used)} / {usd(r.limit)}{pct}{held}  {plural(r.calls, 'call')}",
        (degraded, "yellow"), "  ", (r.state, style))


def tree_view(root: Node) -> Tree:
    """The subtree as a Rich tree (children not shown are counted)."""
    def add(branch: Tree, node: Node) -> None:
        for child in node.children:
            add(branch.add(line(child.row)), child)
        if node.more:
            branch.add(Text(f"... {node.more} more", style="dim"))

    view = Tree(line(root.row), guide_style="dim")
    add(view, root)
    return view


def ids_of(node: Node) -> list[str]:
    """The ids of the contexts shown, ``node`` first."""
    return [node.row.id, *(cid for child in node.children for cid in ids_of(child))]


def with_events(view: Tree, events: list[EventLine], calls: list[CallLine] | None = None
                ) -> RenderableType:
    """The tree with its newest calls and events under it (none: the tree alone)."""
    parts: list[RenderableType] = [view]
    if calls:
        parts += [Text("\ncalls, newest first:", style="bold"), *(Text(c.line()) for c in calls)]
    if events:
        parts += [Text("\nevents, newest first:", style="bold"), *(Text(e.line()) for e in events)]
    return Group(*parts) if len(parts) > 1 else view


def tree_text(coord: Coordinator, ctx_id: str) -> str:
    """The subtree under ``ctx_id`` as plain text lines (for the demo's output)."""
    root, _ = read_tree(coord, locate(coord, ctx_id))
    buf = io.StringIO()
    Console(file=buf, width=1000, no_color=True, highlight=False).print(tree_view(root))
    return buf.getvalue().rstrip("\n")


def tree_json(root: Node, now_ms: int, events: list[EventLine], calls: list[CallLine]
              ) -> dict[str, Any]:
    """The stable JSON shape of `tree` (docs/cli.md)."""
    return {"read_at_ms": now_ms, "tree": root.as_json(now_ms),
            "recent_calls": [c.as_json() for c in calls],
            "events": [e.as_json() for e in events]}


def read_all(coord: Coordinator, where: Located, calls: int
             ) -> tuple[Node, int, list[EventLine], list[CallLine]]:
    """The subtree, when it was read, and the newest events and ``calls`` newest calls
    of the contexts read."""
    root, now = read_tree(coord, where)
    ids = ids_of(root)
    return root, now, read_events(coord, where.root, ids), read_calls(
        coord, where.root, ids, calls)


@app.command(cls=PlainCommand)
def tree(
    ctx: typer.Context,
    context_id: Annotated[str, typer.Argument(
        metavar="ID", help="A context id, or the start of an open tree's id.")],
    json_out: JsonOption = False,
    watch: WatchOption = None,
    calls: Annotated[int, typer.Option(
        "--calls", metavar="N", min=0, max=1000,
        help=f"List the N newest calls under the tree (default {DEFAULT_CALLS}; 0: none).")
    ] = DEFAULT_CALLS,
) -> None:
    """A context's subtree: spend against each ceiling, calls (degraded ones counted),
    who stopped what, the newest calls (the model that ran, refusals) and events (limit
    changes, aborts, degraded models, budget warnings)."""
    with connect(ctx) as coord:
        where = locate(coord, context_id)
        if json_out:
            print_json(lambda: tree_json(*read_all(coord, where, calls)), watch)
            return

        def render() -> RenderableType:
            root, _, events, recent = read_all(coord, where, calls)
            return with_events(tree_view(root), events, recent)

        show(render, watch, f"budgetctl tree {where.ctx_id}")
