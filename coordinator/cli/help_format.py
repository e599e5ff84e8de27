"""How budgetctl's help reads: flags without a type tag (Typer shows ``<bool>``) and
arguments in usage lines as ``ID`` and ``[REASON]...`` (Typer shows ``{ID}``). Every
command and group of budgetctl is built with these classes."""

from __future__ import annotations

from typing import Any

from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption


def _plain(params: list[Any]) -> list[Any]:
    """``params``, their flags given an empty metavar: the help's type column stays empty."""
    for param in params:
        if isinstance(param, TyperOption) and param.is_flag and param.metavar is None:
            param.metavar = ""
    return params


def _usage_name(argument: TyperArgument) -> str:
    """``ID``, ``[REASON]``, ``[REASON]...``: required bare, optional in brackets."""
    name = argument.metavar or (argument.name or "").upper()
    name = name if argument.required else f"[{name}]"
    return name + "..." if argument.nargs != 1 else name


class PlainCommand(TyperCommand):
    """A command whose help shows no ``<bool>`` and no braces."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _plain(super().get_params(ctx))

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        return pieces + [_usage_name(p) for p in self.get_params(ctx)
                         if isinstance(p, TyperArgument)]


class PlainGroup(TyperGroup):
    """A command group whose help shows no ``<bool>``."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _plain(super().get_params(ctx))
