"""Node identity: who wrote a rollout file, proven by an Ed25519 signature.

Anyone who can write to the bucket is a peer, and a path is only a claim. So each node holds
a signing key, and every Parquet file it publishes gets a signature object beside it::

    <root>/_keys/swarm_id=<S>/node_id=<N>/key.jsonl              the node's public key
    <root>/_signatures/<the file's key minus .parquet>/<sha256>.jsonl   its signature
    <root>/_swarms/swarm_id=<S>/swarm.jsonl                      the swarm's rules

The signature covers ``sapo-signature-v1``, the file's key and the SHA-256 of its bytes, so
a signature cannot be replayed for another file, another name, or another node's prefix.
Signatures are named by the digest of the bytes they sign, and written before the file: a
publish that wrote its signature and failed before the file is retried with new bytes (a new
``published_at``), which get a signature of their own instead of meeting the old one.

**Which key is a node's: a key object per node, written once, first writer wins.** Both
writes are conditional (S3 ``If-None-Match``, a local hard link), so exactly one key object
can exist per (swarm, node), and a node that finds another key under its id stops with an
error instead of publishing what readers would drop. We chose this over one write-once
manifest listing every member because a SAPO swarm is open-ended: nodes join at any time and
no one has to collect keys first. The price is trust on first use: whoever registers an id
first owns it, so an organiser who wants a closed swarm registers its members' keys before
they start (``Ledger.register_key``), and per-node bucket credentials (``sapo ledger
credentials``, infra/README.md) stop a peer from writing under another node's prefix at all.

**Which swarms require signatures.** The first node of a swarm writes its rules object,
once; ``sapo`` nodes declare ``signatures: required`` unless configured ``open``. Readers
then skip every file of that swarm that is unsigned, signed by a key other than the
registered one, or signed for other bytes (``LedgerConfig.check_signatures`` can also require
them everywhere, or turn the check off). A swarm with no rules object is open: ledgers
written by hand, the synthetic demo, older versions.

**Which nodes belong to a swarm.** Anyone, unless its rules object lists ``members`` (a
closed swarm: every swarm of ``sapo experiment``, whose sweep is fixed before it runs).
Readers then skip whatever another node writes in it (``NOT_A_MEMBER``): its files, its node
logs, a manifest that would change the swarm's configuration. Keys still make the members'
identities; the list only says which ids count. A node holds to the list in its own
configuration (``Registry.pin_members``) whatever the object says.

**Every object a node writes under its own prefix is signed**: rollout files, node logs
(``_samples/``, ``_evaluations/``, ``_trainings/``) and manifests, each with a signature
object named by the digest of its bytes. A reader requires a rollout file's signature where
the swarm's rules do, and for any node that has a registered key whatever the rules say
(``Registry.must_sign``), and a report's where the node's key object says it signs them
(``signs``: every node since reports were signed; ``Registry.must_sign_reports``, so older
ledgers keep their reports). A peer that shares the bucket's credentials cannot write a
node's reports for it, nor open its files by rewriting the rules object.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Final, Literal

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from ledger.schema import check_id

KEYS_PREFIX: Final = "_keys/"
SIGNATURES_PREFIX: Final = "_signatures/"
SWARMS_PREFIX: Final = "_swarms/"
PREFIXES: Final = (KEYS_PREFIX, SIGNATURES_PREFIX, SWARMS_PREFIX)
MAX_OBJECT_BYTES: Final = 4096
"""Largest key or signature object a reader reads."""
MAX_RULES_BYTES: Final = 65_536
"""Largest rules object a reader reads (a closed swarm's lists up to 256 node ids)."""
MAX_MEMBERS: Final = 1024
DOMAIN: Final = b"sapo-signature-v1"

SignatureMode = Literal["required", "open"]
SIGNED_KINDS: Final = ("rollouts", "reports")
"""What a node's key object says it signs (``signs``); absent: rollouts only (older nodes)."""

# Why a reader skipped a rollout file (ledger_files statuses).
UNSIGNED: Final = "unsigned"
BAD_SIGNATURE: Final = "bad_signature"
UNKNOWN_SIGNER: Final = "unknown_signer"
NOT_A_MEMBER: Final = "not_a_member"
"""Written in a closed swarm by a node its rules do not list (rollout files, node logs,
manifests alike)."""
REWRITTEN: Final = "identity_rewritten"
"""A key or rules object rewritten after a reader first read it (refused; validate lists it)."""


class IdentityError(ValueError):
    """A key, signature or rules object that cannot be used, with the reason."""


def key_object_key(swarm_id: str, node_id: str) -> str:
    return (
        f"{KEYS_PREFIX}swarm_id={check_id('swarm_id', swarm_id)}/"
        f"node_id={check_id('node_id', node_id)}/key.jsonl"
    )


def swarm_rules_key(swarm_id: str) -> str:
    return f"{SWARMS_PREFIX}swarm_id={check_id('swarm_id', swarm_id)}/swarm.jsonl"


def signature_key(file_key: str, sha256: str) -> str:
    """Where the signature of ``file_key`` holding bytes of digest ``sha256`` lives."""
    return f"{SIGNATURES_PREFIX}{file_key.removesuffix('.parquet')}/{sha256}.jsonl"


def signed_message(file_key: str, sha256: str) -> bytes:
    return b"\n".join([DOMAIN, file_key.encode(), sha256.encode()])


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class NodeKey:
    """A node's signing key, and the (swarm, node) it signs for."""

    swarm_id: str
    node_id: str
    private: Ed25519PrivateKey

    @classmethod
    def generate(cls, swarm_id: str, node_id: str) -> NodeKey:
        return cls(
            check_id("swarm_id", swarm_id),
            check_id("node_id", node_id),
            Ed25519PrivateKey.generate(),
        )

    @classmethod
    def load(cls, path: str | Path, swarm_id: str, node_id: str) -> NodeKey:
        """The key saved at ``path`` (PEM); IdentityError when it is absent or not one."""
        path = Path(path)
        try:
            loaded = serialization.load_pem_private_key(path.read_bytes(), password=None)
        except (OSError, ValueError) as exc:
            raise IdentityError(f"cannot read a private key from {path}: {exc}") from None
        if not isinstance(loaded, Ed25519PrivateKey):
            raise IdentityError(f"{path} does not hold an Ed25519 private key")
        return cls(check_id("swarm_id", swarm_id), check_id("node_id", node_id), loaded)

    @classmethod
    def load_or_create(cls, path: str | Path, swarm_id: str, node_id: str) -> NodeKey:
        """The key saved at ``path`` (PEM, owner-readable only), created there if absent."""
        path = Path(path)
        if path.exists():
            return cls.load(path, swarm_id, node_id)
        key = cls.generate(swarm_id, node_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        pem = key.private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(pem)
        return key

    def draw_secret(self) -> bytes:
        """The secret that keys this node's draws of peers' groups (ledger/draws.py):
        derived from its private key, so it is made at the node's first start, kept with
        its checkpoints, and known to nobody who does not hold the key."""
        raw = self.private.private_bytes(
            serialization.Encoding.Raw,
            serialization.PrivateFormat.Raw,
            serialization.NoEncryption(),
        )
        return hmac.new(raw, b"sapo/draw-secret/v1", hashlib.sha256).digest()

    @property
    def public_b64(self) -> str:
        raw = self.private.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        return base64.b64encode(raw).decode()

    def key_object(self, now: datetime | None = None) -> bytes:
        """The public key object readers look this node up by."""
        record = {
            "swarm_id": self.swarm_id,
            "node_id": self.node_id,
            "algorithm": "ed25519",
            "public_key": self.public_b64,
            # What this node signs: readers require a signature on its reports (node logs,
            # manifests) only when its key says so; older nodes signed rollouts only.
            "signs": list(SIGNED_KINDS),
            "registered_at": (now or datetime.now(UTC)).isoformat(),
        }
        return (json.dumps(record) + "\n").encode()

    def signature_object(self, file_key: str, data: bytes) -> bytes:
        sha = sha256_of(data)
        signature = self.private.sign(signed_message(file_key, sha))
        record = {"key": file_key, "sha256": sha, "signature": base64.b64encode(signature).decode()}
        return (json.dumps(record) + "\n").encode()


def _json_object(data: bytes, what: str, most: int = MAX_OBJECT_BYTES) -> dict[str, object]:
    if len(data) > most:
        raise IdentityError(f"{what}: {len(data)} bytes > {most}")
    try:
        record = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise IdentityError(f"{what}: not JSON ({exc})") from exc
    except RecursionError:  # a peer's "[[[[..." thousands deep: refused, never a crashed reader
        raise IdentityError(f"{what}: JSON nested too deeply") from None
    if not isinstance(record, dict):
        raise IdentityError(f"{what}: not a JSON object")
    return record


def signs_reports(data: bytes) -> bool:
    """Whether a (usable) key object says its node signs its reports."""
    try:
        signs = _json_object(data, "key object").get("signs")
    except IdentityError:
        return False
    return isinstance(signs, list) and "reports" in signs


def parse_public_key(data: bytes, swarm_id: str, node_id: str) -> Ed25519PublicKey:
    """The public key in a key object, which must name the (swarm, node) of its place."""
    record = _json_object(data, "key object")
    if record.get("swarm_id") != swarm_id or record.get("node_id") != node_id:
        raise IdentityError("key object names another swarm or node than its place")
    if record.get("algorithm") != "ed25519" or not isinstance(record.get("public_key"), str):
        raise IdentityError("key object holds no ed25519 public_key")
    try:
        raw = base64.b64decode(str(record["public_key"]), validate=True)
        return Ed25519PublicKey.from_public_bytes(raw)
    except ValueError as exc:
        raise IdentityError(f"key object: bad public key ({exc})") from exc


@dataclass(frozen=True)
class SwarmRules:
    """A swarm's rules: whether its files must be signed, and, for a closed swarm, the only
    nodes that belong to it (None: anyone may join)."""

    signatures: SignatureMode
    members: frozenset[str] | None = None


def parse_rules(data: bytes) -> SwarmRules:
    record = _json_object(data, "swarm rules", MAX_RULES_BYTES)
    mode = record.get("signatures")
    if mode not in ("required", "open"):
        raise IdentityError(f"swarm rules: signatures must be 'required' or 'open', not {mode!r}")
    listed = record.get("members")
    if listed is None:
        return SwarmRules("required" if mode == "required" else "open")
    if not isinstance(listed, list) or not 0 < len(listed) <= MAX_MEMBERS:
        raise IdentityError(f"swarm rules: members must be a list of 1 to {MAX_MEMBERS} ids")
    try:
        members = frozenset(check_id("node_id", m) for m in listed)
    except ValueError as exc:
        raise IdentityError(f"swarm rules: {exc}") from None
    return SwarmRules("required" if mode == "required" else "open", members)


def rules_object(
    mode: SignatureMode, now: datetime | None = None, members: Iterable[str] | None = None
) -> bytes:
    """A swarm's rules object; ``members``: the nodes of a closed swarm (None: open to all)."""
    record: dict[str, object] = {"signatures": mode}
    if members is not None:
        record["members"] = sorted(check_id("node_id", m) for m in members)
    record["declared_at"] = (now or datetime.now(UTC)).isoformat()
    return (json.dumps(record) + "\n").encode()


def verify(public: Ed25519PublicKey, file_key: str, signature: bytes, data: bytes) -> str | None:
    """Why ``data`` at ``file_key`` is not signed by ``public`` per ``signature`` (the
    signature object's bytes), or None if it is."""
    try:
        record = _json_object(signature, "signature")
    except IdentityError as exc:
        return str(exc)
    if record.get("key") != file_key:
        return "signature for another file"
    if record.get("sha256") != sha256_of(data):
        return "signature for other bytes"
    try:
        raw = base64.b64decode(str(record.get("signature", "")), validate=True)
        public.verify(raw, signed_message(file_key, sha256_of(data)))
    except (ValueError, InvalidSignature):
        return "signature does not verify with the node's registered key"
    return None


def judge(
    public: Ed25519PublicKey, key: str, data: bytes, signature: bytes | None
) -> tuple[str, str] | None:
    """(UNSIGNED or BAD_SIGNATURE, why) unless ``signature`` (the signature object's bytes,
    None: absent) signs exactly ``data`` at ``key`` with ``public``; else None."""
    if signature is None:
        return UNSIGNED, "no signature for these bytes"
    problem = verify(public, key, signature, data)
    return (BAD_SIGNATURE, problem) if problem else None
