"""The canary routing rule: stable per user across processes, the configured share of users."""

from __future__ import annotations

import hashlib
import math
import subprocess
import sys

from liveloop.release.routing import bucket, in_canary, user_key


def test_bucket_is_sha256_of_the_key():
    expected = int.from_bytes(hashlib.sha256(b"alice").digest()[:8], "big") / 2**64
    assert bucket("alice") == expected and 0 <= bucket("alice") < 1


def test_the_same_user_gets_the_same_answer_in_another_process():
    users = [f"u{i}" for i in range(20)]
    code = "from liveloop.release.routing import in_canary; print([in_canary(f'u{i}', 0.3) for i in range(20)])"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert other == str([in_canary(u, 0.3) for u in users])


def test_the_share_of_users_is_the_fraction_within_a_binomial_bound():
    n, fraction = 20_000, 0.1
    hits = sum(in_canary(f"user-{i}", fraction) for i in range(n))
    sd = math.sqrt(n * fraction * (1 - fraction))  # 42.4
    assert abs(hits - n * fraction) < 4 * sd


def test_a_larger_fraction_keeps_every_user_of_a_smaller_one():
    users = [f"k{i}" for i in range(2_000)]
    small = {u for u in users if in_canary(u, 0.05)}
    large = {u for u in users if in_canary(u, 0.2)}
    assert small and small <= large


def test_by_key_a_key_cannot_choose_its_side_with_user_strings():
    assert user_key("bob", "key-1") == user_key(None, "key-1") == user_key("", "key-1") == "key:key-1"
    # whatever a key sends as `user`, all its requests go the same way
    sides = {in_canary(user_key(f"try-{i}", "key-1"), 0.5) for i in range(200)}
    assert len(sides) == 1


def test_by_user_the_user_is_hashed_under_the_key_and_never_confused():
    assert user_key("bob", "key-1", "user") == "key:key-1/user:bob"
    assert user_key(None, "key-1", "user") == user_key("", "key-1", "user") == "key:key-1"
    assert user_key("bob", "key-1", "user") != user_key("bob", "key-2", "user")  # another key's bob is another user
    assert user_key("key-1", "x", "user") != user_key(None, "key-1", "user")
