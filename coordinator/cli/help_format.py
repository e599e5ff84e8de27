"""How budgetctl's help reads: options without a type tag (Typer shows ``<bool>``,
``<int range>``) and arguments in usage lines as ``ID`` and ``[REASON]...`` (Typer shows
``{ID}``). Every command and group of budgetctl is built with these classes (a test walks
the help of each)."""

from __future__ import annotations

from typing import Any

from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption


class _PlainArgument(TyperArgument):
    """An argument whose help shows no type column (its name, ``ID``, says what it is)."""

    def display_type_rich(self, ctx: Any) -> str | None:
        return None


def _metavar(option: TyperOption) -> str:
    """``spend|fraction|age`` for a choice (an enum's values), else the option's name."""
    desc = option.type_descriptor
    if desc.is_choice and desc.choices:
        return "|".join(str(getattr(c, "value", c)) for c in desc.choices)
    return (option.name or "").upper()


def _plain(params: list[Any]) -> list[Any]:
    """``params`` without Typer's type tags: flags get an empty metavar, other options a
    word, arguments no type column."""
    for param in params:
        if type(param) is TyperArgument:
            param.__class__ = _PlainArgument
        elif isinstance(param, TyperOption) and param.metavar is None:
            param.metavar = "" if param.is_flag else _metavar(param)
    return params


def _usage_name(argument: TyperArgument) -> str:
    """``ID``, ``[REASON]``, ``[REASON]...``: required bare, optional in brackets."""
    name = argument.metavar or (argument.name or "").upper()
    name = name if argument.required else f"[{name}]"
    return name + "..." if argument.nargs != 1 else name


class PlainCommand(TyperCommand):
    """A command whose help shows no type tag (``<bool>``) and no braces."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _plain(super().get_params(ctx))

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        return pieces + [_usage_name(p) for p in self.get_params(ctx)
                         if isinstance(p, TyperArgument)]


class PlainGroup(TyperGroup):
    """A command group whose help shows no type tag (``<bool>``)."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _plain(super().get_params(ctx))
