"""Fuzzing the token decoder: arbitrary input and mutated valid tokens only ever produce a
TokenError (never another exception, never a forged acceptance)."""

from __future__ import annotations

import base64
import random
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coordinator.core.token_codec import TokenCodec
from coordinator.errors import TokenError
from tests.context.test_tokens import ALPHABET, KEY, NOW, b64, forge, good_fields
from tests.support.procs import TEST_KEYS

CODEC = TokenCodec(TEST_KEYS)
VALID = CODEC.encode(root="root-id", path=("root-id", "mid", "leaf"), tenant="t",
                     ttl_s=600, now=NOW)
FUZZ_SETTINGS = settings(max_examples=400, deadline=None, database=None,
                         suppress_health_check=[HealthCheck.too_slow])


def outcome(token: object) -> str:
    """The decoder's verdict; anything but a TokenError fails the test."""
    try:
        CODEC.decode(token, now=NOW, tenant="t")
    except TokenError as exc:
        return type(exc).__name__
    return "accepted"


@FUZZ_SETTINGS
@given(st.binary(max_size=6000))
def test_arbitrary_bytes_are_rejected_with_a_token_error(data: bytes) -> None:
    assert outcome(data) != "accepted"


@FUZZ_SETTINGS
@given(st.text(max_size=300))
def test_arbitrary_text_is_rejected_with_a_token_error(text: str) -> None:
    assert outcome(text) != "accepted"


@FUZZ_SETTINGS
@given(st.data())
def test_mutated_valid_tokens_are_rejected(data: st.DataObject) -> None:
    chars = list(VALID)
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(["replace", "delete", "insert"]))
        i = data.draw(st.integers(0, max(0, len(chars) - 1)))
        if op == "replace" and chars:
            chars[i] = data.draw(st.sampled_from(ALPHABET + ".=/+ \x00é"))
        elif op == "delete" and chars:
            del chars[i]
        else:
            chars.insert(i, data.draw(st.sampled_from(ALPHABET + ".=")))
    mutated = "".join(chars)
    if mutated != VALID:
        assert outcome(mutated) != "accepted"


msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats()
    | st.text(max_size=20) | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=5)
    | st.dictionaries(st.text(max_size=5), inner, max_size=5),
    max_leaves=20,
)


def well_formed(fields: list[Any], tenant: str = "t") -> bool:
    """What a genuine version-1 token for ``tenant`` at NOW looks like."""
    if len(fields) != 8:
        return False
    v, kid, root, ctx, path, ten, issued, expires = fields
    return (type(v) is int and v == 1 and kid == "test" and ten == tenant
            and isinstance(path, list) and bool(path) and path[0] == root and path[-1] == ctx
            and all(isinstance(p, str) and p for p in path) and len(set(path)) == len(path)
            and type(issued) is int and type(expires) is int and issued <= expires
            and issued <= NOW + 60 and NOW <= expires + 60)


@settings(FUZZ_SETTINGS, max_examples=200)
@given(st.lists(msgpack_values, max_size=10))
def test_signed_payloads_of_any_shape_are_accepted_only_when_well_formed(
    fields: list[Any],
) -> None:
    """Even a correctly signed payload must have the exact shape (a buggy issuer with the
    key cannot make the decoder crash or accept nonsense)."""
    assert (outcome(forge(fields, KEY)) == "accepted") == well_formed(fields)


def _mutate(rng: random.Random, token: str) -> tuple[object, list[Any] | None]:
    """One random damage to a valid token, random input, or a payload signed with the real
    key (then its fields are returned too: only such a payload may legitimately verify)."""
    op = rng.randrange(10)
    n = len(token)
    body, _, sig = token.partition(".")
    if op == 0:  # replace one character
        i = rng.randrange(n)
        return token[:i] + rng.choice(ALPHABET + ".") + token[i + 1:], None
    if op == 1:  # delete a range
        i = rng.randrange(n)
        return token[:i] + token[i + rng.randint(1, 8):], None
    if op == 2:  # insert characters
        i = rng.randrange(n + 1)
        extra = "".join(rng.choices(ALPHABET + ".=", k=rng.randint(1, 4)))
        return token[:i] + extra + token[i:], None
    if op == 3:  # truncate
        return token[:rng.randrange(n)], None
    if op == 4:  # swap or repeat the parts
        return rng.choice([f"{sig}.{body}", f"{body}.{body}", f"{body}.{sig}.{sig}"]), None
    if op == 5:  # random bytes
        return rng.randbytes(rng.randint(0, 200)), None
    if op == 6:  # flip one bit of the payload, keep the signature
        raw = bytearray(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
        return f"{b64(bytes(raw))}.{sig}", None
    if op == 7:  # a correctly signed payload with one field of another kind
        fields = good_fields()
        fields[rng.randrange(len(fields))] = rng.choice(
            [None, True, 1.5, -1, 2**64 - 1, "", "x" * 50, b"b", [], {}, ["r"], [1, 2]])
        return forge(fields, KEY), fields
    if op == 8:  # oversized
        return token * rng.randint(60, 80), None
    return (token.encode() if rng.random() < 0.5 else token), None  # intact


@pytest.mark.slow
def test_a_hundred_thousand_mutations_only_ever_raise_token_errors() -> None:
    rng = random.Random(20261125)
    verdicts: Counter[str] = Counter()
    valid = CODEC.encode(root="r", path=("r", "c"), tenant="", ttl_s=600, now=NOW)
    intact = {valid, valid.encode()}
    for _ in range(100_000):
        token, signed = _mutate(rng, valid)
        try:
            CODEC.decode(token, now=NOW, tenant="")
        except TokenError as exc:
            verdicts[type(exc).__name__] += 1
            continue
        # Only the intact token, or a payload signed with the real key whose changed field
        # still makes a valid claim (e.g. an earlier issue time), may verify.
        assert token in intact or (signed is not None and well_formed(
            signed, tenant="")), f"accepted a damaged token: {token!r}"
        verdicts["accepted"] += 1
    assert sum(verdicts.values()) == 100_000
    # Every defence was exercised, not only the first check.
    for name in ("TokenMalformedError", "TokenSignatureError", "TokenTooLargeError",
                 "UnknownKeyError", "TokenVersionError", "accepted"):
        assert verdicts[name] > 0, verdicts
