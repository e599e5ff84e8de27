"""The output sanitizer: default redaction rules, configurable rules, literal paths."""

from __future__ import annotations

import re

import pytest

from coordinator.sessions import DEFAULT_RULES, OutputSanitizer, RedactionRule

clean = OutputSanitizer()


@pytest.mark.parametrize(("text", "secret", "shown"), [
    ("key=sk-proj-abcdefghijklmnopqrstuv", "sk-proj-abcdefghijklmnopqrstuv", "[REDACTED"),
    ("anthropic sk-ant-api03-abcdefghijklmnop", "sk-ant-api03-abcdefghijklmnop",
     "[REDACTED_KEY]"),
    ("aws AKIAABCDEFGHIJKLMNOP here", "AKIAABCDEFGHIJKLMNOP", "[REDACTED_KEY]"),
    ("gh ghp_abcdefghijklmnopqrstuvwxyz0123", "ghp_abcdefghijklmnopqrstuvwxyz0123",
     "[REDACTED_KEY]"),
    ("Authorization: Bearer abcdef0123456789xyz", "abcdef0123456789xyz", "Bearer [REDACTED]"),
    ("password = 'hunter2hunter2'", "hunter2hunter2", "[REDACTED]"),
    ("DB_TOKEN: s3cr3t-value", "s3cr3t-value", "[REDACTED]"),
    ("jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.abcdefghijklmnop",
     "eyJzdWIiOiIxMjM0NTY3ODkwIn0", "[REDACTED_TOKEN]"),
    ("postgres://admin:pa55word@db.internal/app", "pa55word", "[REDACTED]@"),
    ("max_tokens=4096 tokens: 1500", "[REDACTED]", "max_tokens=4096"),
    ("mail alice.smith+x@example.co.uk now", "alice.smith+x@example.co.uk",
     "[REDACTED_EMAIL]"),
    ("open('/home/alice/secret.csv')", "/home/alice", "/home/sandbox"),
    ("at /Users/bob/proj/x.py", "/Users/bob", "/Users/sandbox"),
    ('File "/usr/lib/python3.11/site-packages/pandas/core/frame.py", line 12, in f',
     "pandas/core/frame.py", 'File "[internal]"'),
    ("    at Object.run (/srv/app/node_modules/x/index.js:10:5)", "/srv/app",
     "at [internal]"),
    ("-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----",
     "MIIEow", "[REDACTED_PRIVATE_KEY]"),
])
def test_default_rules_redact(text: str, secret: str, shown: str) -> None:
    out = clean(text)
    assert secret not in out and shown in out


def test_ordinary_output_is_untouched() -> None:
    text = "mean 4.2\n| a | b |\n|---|---|\n| 1 | 2 |\nCell In[3], line 1\n"
    assert clean(text) == text


def test_rules_are_configurable() -> None:
    ticket = RedactionRule.of("ticket", r"\bCASE-\d+\b", "[CASE]")
    custom = OutputSanitizer(extra=[ticket], replace_paths={"/srv/sandboxes/s1": "/sandbox"})
    out = custom("CASE-1234 in /srv/sandboxes/s1/work by a@b.io")
    assert out == "[CASE] in /sandbox/work by [REDACTED_EMAIL]"
    only_email = OutputSanitizer([r for r in DEFAULT_RULES if r.name == "email"])
    assert only_email("sk-live-abcdefghijklmnop x@y.org") == "sk-live-abcdefghijklmnop " \
        "[REDACTED_EMAIL]"
    assert isinstance(ticket.pattern, re.Pattern)
