"""``budgetctl tree``: a context's subtree, spend against each ceiling, and why each
context under a stop halts."""

from __future__ import annotations

import io
from typing import Annotated, Any

import typer
from rich.console import Console, RenderableType
from rich.text import Text
from rich.tree import Tree

from ..runtime.coordinator import Coordinator
from ._common import JsonOption, WatchOption, connect, print_json, show
from .help_format import PlainCommand, PlainGroup
from .reads import locate, read_tree
from .rows import Node, Row, plural, usd

app = typer.Typer(cls=PlainGroup)


def line(r: Row) -> Text:
    """One context: name, full id, spend against its ceiling, calls, state."""
    if r.status == "expired":
        return Text(f"{r.name} {r.id}  (expired)")
    pct = f" {100 * r.fraction:3.0f}%" if r.limit else ""
    held = f" (+{usd(r.held)} reserved)" if r.held else ""
    style = "red" if r.stop else "green" if r.status == "running" else ""
    return Text.assemble(
        (r.name, "bold"), " ", (r.id, "cyan"),
        f"  {usd(r.used)} / {usd(r.limit)}{pct}{held}  {plural(r.calls, 'call')}  ",
        (r.state, style))


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


def tree_text(coord: Coordinator, ctx_id: str) -> str:
    """The subtree under ``ctx_id`` as plain text lines (for the demo's output)."""
    root, _ = read_tree(coord, locate(coord, ctx_id))
    buf = io.StringIO()
    Console(file=buf, width=1000, no_color=True, highlight=False).print(tree_view(root))
    return buf.getvalue().rstrip("\n")


def tree_json(root: Node, now_ms: int) -> dict[str, Any]:
    """The stable JSON shape of `tree` (docs/cli.md)."""
    return {"read_at_ms": now_ms, "tree": root.as_json(now_ms)}


@app.command(cls=PlainCommand)
def tree(
    ctx: typer.Context,
    context_id: Annotated[str, typer.Argument(
        metavar="ID", help="A context id, or the start of an open tree's id.")],
    json_out: JsonOption = False,
    watch: WatchOption = None,
) -> None:
    """A context's subtree: spend against each ceiling, calls, and who stopped what."""
    with connect(ctx) as coord:
        where = locate(coord, context_id)
        if json_out:
            print_json(lambda: tree_json(*read_tree(coord, where)), watch)
            return

        def render() -> RenderableType:
            return tree_view(read_tree(coord, where)[0])

        show(render, watch, f"budgetctl tree {where.ctx_id}")
