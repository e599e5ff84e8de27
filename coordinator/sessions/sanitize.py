"""OutputSanitizer: redaction rules applied to every output and error a session returns
(secrets, e-mail addresses, home paths, internal stack frames; configurable)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class RedactionRule:
    """Replace every match of ``pattern`` with ``replacement`` (``re.sub`` syntax)."""

    name: str
    pattern: re.Pattern[str]
    replacement: str

    @classmethod
    def of(cls, name: str, pattern: str, replacement: str, flags: int = 0) -> RedactionRule:
        return cls(name, re.compile(pattern, flags), replacement)


DEFAULT_RULES: tuple[RedactionRule, ...] = (
    RedactionRule.of("private_key", r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?"
                     r"-----END [A-Z ]*PRIVATE KEY-----", "[REDACTED_PRIVATE_KEY]"),
    RedactionRule.of("jwt", r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}",
                     "[REDACTED_TOKEN]"),
    RedactionRule.of("api_key", r"\b(?:sk|pk|rk)-(?:ant-|proj-|live-|test-)?[A-Za-z0-9_-]{12,}"
                     r"|\bAKIA[0-9A-Z]{16}\b|\bgh[pousr]_[A-Za-z0-9]{20,}"
                     r"|\bxox[abprs]-[A-Za-z0-9-]{10,}|\bAIza[0-9A-Za-z_-]{30,}",
                     "[REDACTED_KEY]"),
    RedactionRule.of("bearer", r"\b(Bearer|Basic)\s+[A-Za-z0-9._~+/=-]{12,}", r"\1 [REDACTED]",
                     re.IGNORECASE),
    # NAME_TOKEN = value: values of 8+ characters (not "max_tokens=4096")
    RedactionRule.of("assignment", r"\b([A-Za-z0-9_]*(?:api[_-]?key|secret|token|password|"
                     r"passwd|pwd)[A-Za-z0-9_]*)(\s*[:=]\s*)(['\"]?)[^\s'\",;]{8,}\3",
                     r"\1\2\3[REDACTED]\3", re.IGNORECASE),
    RedactionRule.of("url_credentials", r"(\b[a-z][a-z0-9+.-]*://)[^/\s:@]+:[^/\s@]+@",
                     r"\1[REDACTED]@", re.IGNORECASE),
    RedactionRule.of("email", r"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*"
                     r"\.[A-Za-z]{2,}\b", "[REDACTED_EMAIL]"),
    RedactionRule.of("home_path", r"/home/[^/\s\"']+", "/home/sandbox"),
    RedactionRule.of("users_path", r"/Users/[^/\s\"']+", "/Users/sandbox"),
    RedactionRule.of("python_frame", r'File "[^"\n]*(?:site-packages|dist-packages|'
                     r'/lib/python\d[^"\n]*)[^"\n]*", line \d+', 'File "[internal]"'),
    RedactionRule.of("js_frame", r"at [^\n()]*\([^\n()]+:\d+:\d+\)", "at [internal]"),
)


class OutputSanitizer:
    """Applies ``rules`` (default: DEFAULT_RULES) then ``extra`` rules, in order.
    ``replace_paths`` maps literal strings (a sandbox's folder) to what is shown."""

    def __init__(self, rules: Iterable[RedactionRule] = DEFAULT_RULES, *,
                 extra: Iterable[RedactionRule] = (),
                 replace_paths: dict[str, str] | None = None) -> None:
        self.rules = (*rules, *extra)
        self.replace_paths = dict(replace_paths or {})

    def __call__(self, text: str) -> str:
        """``text`` with every rule applied."""
        for literal, shown in self.replace_paths.items():
            if literal:
                text = text.replace(literal, shown)
        for rule in self.rules:
            text = rule.pattern.sub(rule.replacement, text)
        return text

    def with_paths(self, paths: dict[str, str]) -> OutputSanitizer:
        """A copy that also replaces ``paths`` (literal -> shown)."""
        return OutputSanitizer(self.rules, replace_paths={**self.replace_paths, **paths})
