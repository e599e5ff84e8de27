"""``budgetctl``: the demo and a few operations commands.

    budgetctl demo                     sub-agents on Celery workers under one ceiling
    budgetctl tree CHAIN_ID            a tree with spend against each ceiling
    budgetctl abort CHAIN_ID [REASON]  stop a context and its subtree, everywhere
    budgetctl top                      trees still open, with spend against their ceiling
    budgetctl spend [--day YYYY-MM-DD] spend of the trees closed that day (UTC) by org, team
                                       and service (kept for the coordinator's retention)

The Redis comes from ``--redis URL`` (before or after the command), else
``BUDGET_REDIS_URL``, ``REDIS_URL``, ``redis://localhost:6379/0``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

import redis

from .core.paths import Path
from .errors import ContextNotFoundError
from .runtime.coordinator import Coordinator
from .runtime.settings import default_url

MAX_KIDS_SHOWN = 50


def _usd(micro: int) -> str:
    return f"${micro / 1e6:.4f}"


def _line(cid: str, h: dict[str, str]) -> str:
    meta = json.loads(h.get("meta") or "{}")
    name = meta.get("service") or "context"
    used, held, limit = (int(h.get(k) or 0) for k in ("u:usd", "h:usd", "l:usd"))
    pct = f" {100 * used / limit:3.0f}%" if limit else ""
    status = h.get("status", "?")
    if status == "stopped":
        status = f"stopped: {h.get('reason')}"
    held_txt = f" (+{_usd(held)} reserved)" if held else ""
    return (f"{name} [{cid[:12]}]  {_usd(used)} / {_usd(limit)}{pct}{held_txt}  "
            f"{int(h.get('u:steps') or 0)} calls  {status}")


def render_tree(coord: Coordinator, chain_id: str) -> list[str]:
    """The subtree under ``chain_id``, one line per context: spend against its ceiling,
    calls, status. Raises ContextNotFoundError for an unknown id."""
    root = coord.views.locate(chain_id)
    if root is None:
        raise ContextNotFoundError(chain_id)
    lines: list[str] = []

    def walk(cid: str, prefix: str, branch: str) -> None:
        h = coord.store.read_hash(root, cid)
        if not h:
            lines.append(f"{prefix}{branch}[{cid[:12]}] (expired)")
            return
        lines.append(prefix + branch + _line(cid, h))
        kids = coord.store.children(root, cid)
        inner = prefix + ("    " if branch == "└── " else "│   " if branch else "")
        for i, kid in enumerate(kids[:MAX_KIDS_SHOWN]):
            last = i == len(kids) - 1 or i == MAX_KIDS_SHOWN - 1
            walk(kid, inner, "└── " if last else "├── ")
        if len(kids) > MAX_KIDS_SHOWN:
            lines.append(f"{inner}... {len(kids) - MAX_KIDS_SHOWN} more")

    walk(chain_id, "", "")
    return lines


def _abort(coord: Coordinator, chain_id: str, reason: str) -> str:
    root = coord.views.locate(chain_id)
    h = coord.store.read_hash(root, chain_id) if root else {}
    if not root or not h:
        raise ContextNotFoundError(chain_id)
    reply = coord.store.abort(Path(root, tuple(h["path"].split(","))), "aborted", reason)
    if reply.outcome == "stopped":
        return f"aborted {chain_id} and its subtree: {reason}"
    return f"{chain_id} was already {reply.status or 'stopped'}; nothing changed"


def render_top(coord: Coordinator) -> list[str]:
    """One line per tree still open: its root's spend against its ceiling."""
    lines = []
    for root in coord.views.active_roots():
        h = coord.store.read_hash(root, root)
        if h:
            lines.append(_line(root, h))
    return lines or ["no open trees"]


def render_spend(coord: Coordinator, day: str | None = None) -> list[str]:
    """Spend of the trees closed on ``day`` by org, team and service, largest first."""
    lines = []
    for label in ("org", "team", "service"):
        view = coord.views.spend_view(label, day)
        for value, micro in sorted(view.items(), key=lambda kv: -kv[1]):
            lines.append(f"{label:8s} {value:30s} {_usd(micro)}")
    return lines or ["no closed trees with org, team or service labels yet"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``budgetctl``."""
    # --redis goes before or after the command (SUPPRESS: a subcommand that is not given
    # it keeps the one given before)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--redis", default=argparse.SUPPRESS,
                        help="Redis URL (default: BUDGET_REDIS_URL, REDIS_URL, "
                             "redis://localhost:6379/0)")
    parser = argparse.ArgumentParser(prog="budgetctl", description=__doc__.split("\n")[0],
                                     parents=[common])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", parents=[common],
                   help="run the demo (starts an embedded Redis if none answers)")
    tree = sub.add_parser("tree", parents=[common],
                          help="print a tree with spend against each ceiling")
    tree.add_argument("chain_id")
    abort = sub.add_parser("abort", parents=[common],
                           help="stop a context and its subtree everywhere")
    abort.add_argument("chain_id")
    abort.add_argument("reason", nargs="?", default="aborted by budgetctl")
    sub.add_parser("top", parents=[common],
                   help="trees still open, with spend against their ceiling")
    spend = sub.add_parser("spend", parents=[common],
                           help="spend of closed trees by org, team and service")
    spend.add_argument("--day", help="UTC day, YYYY-MM-DD (default: today)")
    args = parser.parse_args(argv)
    url: str | None = getattr(args, "redis", None)

    if args.command == "demo":
        from .demo import run_demo

        return run_demo(url)
    coord = Coordinator.from_url(url or default_url())
    try:
        if args.command == "tree":
            print("\n".join(render_tree(coord, args.chain_id)))
        elif args.command == "top":
            print("\n".join(render_top(coord)))
        elif args.command == "spend":
            print("\n".join(render_spend(coord, args.day)))
        else:
            print(_abort(coord, args.chain_id, args.reason))
    except ContextNotFoundError as exc:
        print(f"budgetctl: {exc}", file=sys.stderr)
        return 1
    except redis.RedisError as exc:
        print(f"budgetctl: Redis unavailable: {exc}", file=sys.stderr)
        return 2
    finally:
        coord.client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
