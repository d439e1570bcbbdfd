"""Where a peer's group falls in a receiver's draw: an order no publisher can compute.

Everything a publisher writes is chosen by it (ids, stamps, claimed rewards), and anything a
receiver publishes about itself (its id, its seed, its round, its sample log) is public. A
draw ordered by a hash of those alone can be ground offline: a peer tries nonces in its ids
until its groups, or its node id, come first in some receiver's next rounds (issue 57: two
Sybils took all of a receiver's J that way). So a node's draw is keyed by a secret only it
holds:

- the node's **draw secret**, derived from its signing key (``NodeKey.draw_secret``): made
  at its first start and kept with its checkpoints, so a node resumed after a stop draws
  what it would have drawn;
- per round, a **draw key**: HMAC-SHA256 of (swarm, node, round) under that secret, so one
  round's key (were it ever learned) says nothing of the next.

In SQL, every group's and every peer's place in the draw is ``md5(draw key / x)`` turned
into a uniform number in (0, 1): ``keyed_uniform_sql``. The sampler computes it once per draw
in ``drawable`` (ledger/policies/drawable.sql), as columns ``u`` (the group) and ``peer_u``
(its publisher); policies order by those columns and hash nothing themselves, so a new policy
cannot bring back a public order. A cryptographic hash under a 128-bit secret prefix, not
DuckDB's ``hash`` (a fast mixer, not a keyed function: a publisher who chooses its input
freely should not be trusted to find no bias in it). MD5's broken collision resistance does
not matter here: to steer, a publisher would have to predict outputs under a key it never
sees. MD5 rather than SHA-256 because it is 2.5x cheaper in DuckDB (measured: 38k groups,
8 ms against 19 ms; DuckDB's ``md5_number_upper`` is slower still).

A draw without a secret (``sapo ledger sample`` for analysis, tests, benchmarks) is keyed by
``public_draw_key(receiver, seed)``: replayable from the seed, and as predictable.
"""

from __future__ import annotations

import hashlib
import hmac

DRAW_KEY_HEX = 32
"""A draw key is 128 bits, as hex."""


def round_draw_key(secret: bytes, swarm_id: str, node_id: str, node_round: int) -> str:
    """The draw key of ``node_id``'s draw for ``node_round``: secret, and new every round."""
    message = f"sapo/draw/v1/{swarm_id}/{node_id}/{int(node_round)}".encode()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()[:DRAW_KEY_HEX]


def public_draw_key(node_id: str, seed: int) -> str:
    """The draw key of a draw without a secret: anyone who knows the receiver and the seed
    computes it (and so the draw)."""
    return hashlib.sha256(f"sapo/public-draw/v1/{node_id}/{int(seed)}".encode()).hexdigest()[
        :DRAW_KEY_HEX
    ]


def check_draw_key(key: str) -> str:
    """``key`` if it is a draw key (lowercase hex of 128 bits); ValueError otherwise."""
    if len(key) != DRAW_KEY_HEX or any(c not in "0123456789abcdef" for c in key):
        raise ValueError(f"a draw key is {DRAW_KEY_HEX} lowercase hex digits")
    return key


def keyed_uniform_sql(key: str, value: str) -> str:
    """SQL: a number in (0, 1), uniform over keys, from the MD5 of ``key``/``value`` (two SQL
    expressions): the digest's top 52 bits, centred in their cell."""
    digest = f"md5_number(concat({key}, '/', {value}))"
    return f"(({digest} >> 76)::DOUBLE + 0.5) / 4503599627370496.0"
