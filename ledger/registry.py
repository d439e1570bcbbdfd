"""What a reader knows of identities, and how it learns it from the store.

``Registry`` holds, in memory, the registered public keys and each swarm's rules (ledger/
identity.py says what they are and why), and judges by them: which node must sign what,
which node belongs to a closed swarm, whether bytes are vouched for. ``IdentityIndex`` reads
the key and rules objects a listing shows (each once: they are written once) into a
registry, and reads the signature objects a judgement needs.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from ledger.identity import (
    BAD_SIGNATURE,
    KEYS_PREFIX,
    MAX_OBJECT_BYTES,
    MAX_RULES_BYTES,
    NOT_A_MEMBER,
    SWARMS_PREFIX,
    UNKNOWN_SIGNER,
    IdentityError,
    SwarmRules,
    judge,
    parse_public_key,
    parse_rules,
    sha256_of,
    signature_key,
    signs_reports,
)
from ledger.keys import object_place
from ledger.schema import check_id
from ledger.storage import NotRegularFile, ObjectInfo, OversizedObject, Store, is_local


class Registry:
    """What a reader knows of identities: the registered public keys and each swarm's rules,
    read once per object (both are written once)."""

    def __init__(self) -> None:
        self.keys: dict[tuple[str, str], Ed25519PublicKey | IdentityError] = {}
        self.rules: dict[str, SwarmRules | IdentityError] = {}
        self.pinned: set[str] = set()
        """Swarms this reader requires signatures of, whatever their rules object says."""
        self.reporters: set[tuple[str, str]] = set()
        """Nodes whose pinned key object says they sign their reports too."""
        self.pinned_members: dict[str, frozenset[str] | None] = {}
        """Closed swarms' members as this reader was configured with them (a node's own
        swarm file), whatever the rules object says."""
        self.changed: dict[str, str] = {}
        """Key and rules objects found rewritten after this reader first read them, by key:
        refused (the first reading stays), and reported by ``Ledger.validate``."""

    def learn(self, key: str, data: bytes | None) -> None:
        """Take in one object of ``KEYS_PREFIX`` or ``SWARMS_PREFIX`` (None: unreadable).

        The first usable reading of an object is pinned: a rewrite (shared credentials let a
        peer overwrite another node's key, or reopen a swarm) is refused and recorded in
        ``changed``, never adopted. An unusable reading (unreadable, malformed) is no
        verdict for good: a later usable one replaces it."""
        parts = _place(key)
        if parts is None:
            return
        swarm_id, node_id = parts
        learned: Ed25519PublicKey | SwarmRules | IdentityError
        try:
            if data is None:
                raise IdentityError("unreadable")
            learned = (
                parse_rules(data) if node_id is None else parse_public_key(data, swarm_id, node_id)
            )
        except IdentityError as exc:
            learned = exc
        if node_id is None:
            self._pin(key, self.rules, swarm_id, learned)  # type: ignore[arg-type]
            return
        self._pin(key, self.keys, (swarm_id, node_id), learned)  # type: ignore[arg-type]
        if data is not None and self.keys[(swarm_id, node_id)] is learned:  # the pinned one
            if signs_reports(data):
                self.reporters.add((swarm_id, node_id))
            else:
                self.reporters.discard((swarm_id, node_id))

    def _pin(self, key: str, known: dict[object, object], slot: object, learned: object) -> None:
        before = known.get(slot)
        if before is None or isinstance(before, IdentityError):
            known[slot] = learned
        elif isinstance(learned, IdentityError) or not _same(before, learned):
            self.changed[key] = f"rewritten after it was first read ({learned}); kept the first"

    def pin_key(self, swarm_id: str, node_id: str, public: Ed25519PublicKey) -> None:
        """Hold ``public`` as (swarm, node)'s key whatever the store says: what a node does
        for itself, since it knows its own key."""
        self.keys[(swarm_id, node_id)] = public
        self.reporters.add((swarm_id, node_id))

    def pin_required(self, swarm_id: str) -> None:
        self.pinned.add(swarm_id)

    def requires_signatures(self, swarm_id: str, mode: str) -> bool:
        """Whether files of ``swarm_id`` must be signed, under the reader's ``mode``
        ('swarm': as its rules say, 'required': always, 'off': never). Unreadable rules
        count as required: a peer cannot open a swarm by corrupting them."""
        if mode != "swarm":
            return mode == "required"
        if swarm_id in self.pinned:
            return True
        rules = self.rules.get(swarm_id)
        return rules is not None and (
            isinstance(rules, IdentityError) or rules.signatures != "open"
        )

    def pin_members(self, swarm_id: str, members: Iterable[str] | None) -> None:
        """Hold ``swarm_id`` closed to all but ``members`` (None: open to any node) whatever
        its rules object says: what a node does for its own swarm."""
        self.pinned_members[swarm_id] = None if members is None else frozenset(members)

    def members(self, swarm_id: str) -> frozenset[str] | None:
        """The nodes of a closed swarm (this reader's own list first), None if it is open."""
        if swarm_id in self.pinned_members:
            return self.pinned_members[swarm_id]
        rules = self.rules.get(swarm_id)
        return rules.members if isinstance(rules, SwarmRules) else None

    def not_a_member(self, key: str) -> tuple[str, str] | None:
        """(NOT_A_MEMBER, why) if ``key`` is a node's object in a closed swarm that does not
        list that node; else None."""
        place = object_place(key)
        if place is None:
            return None
        members = self.members(place[0])
        if members is None or place[1] in members:
            return None
        return NOT_A_MEMBER, f"{place[1]} is not a member of closed swarm {place[0]}"

    def must_sign(self, swarm_id: str, node_id: str, mode: str) -> bool:
        """Whether ``node_id``'s rollout files must be signed: where its swarm requires it,
        and, whatever the rules say, once the node has a registered key (every ``sapo`` node
        registers one and signs). A rules object rewritten to ``open`` then opens nothing of
        a node with a key."""
        if mode == "off":
            return False
        if self.requires_signatures(swarm_id, mode):
            return True
        # A key object that cannot be used counts too: fail closed.
        return (swarm_id, node_id) in self.keys

    def must_sign_reports(self, swarm_id: str, node_id: str, mode: str) -> bool:
        """Whether ``node_id``'s node logs and manifests must be signed: once its registered
        key says it signs them (``signs``; older nodes' reports stay readable unsigned)."""
        return mode != "off" and (swarm_id, node_id) in self.reporters

    def signing_key(self, swarm_id: str, node_id: str) -> Ed25519PublicKey | tuple[str, str]:
        """The node's registered key, or (UNKNOWN_SIGNER, why) when it has no usable one."""
        public = self.keys.get((swarm_id, node_id))
        if isinstance(public, Ed25519PublicKey):
            return public
        return UNKNOWN_SIGNER, f"no usable key registered for {node_id}: {public or 'none'}"

    def vouch(self, key: str, data: bytes, signature: bytes | None) -> tuple[str, str] | None:
        """Why ``data`` at ``key`` is not vouched for by its node's registered key per
        ``signature`` (the signature object's bytes, None: absent): (status, detail), or
        None when it is."""
        place = object_place(key)
        if place is None:
            return BAD_SIGNATURE, "not under swarm_id=/node_id="
        public = self.signing_key(*place)
        if isinstance(public, tuple):
            return public
        return judge(public, key, data, signature)


def _same(a: object, b: object) -> bool:
    if isinstance(a, Ed25519PublicKey) and isinstance(b, Ed25519PublicKey):
        return a.public_bytes_raw() == b.public_bytes_raw()
    return a == b


def _place(key: str) -> tuple[str, str | None] | None:
    """(swarm, node) of a key object, (swarm, None) of a rules object, else None."""
    parts = key.split("/")
    try:
        if key.startswith(KEYS_PREFIX) and len(parts) == 4 and parts[3] == "key.jsonl":
            swarm = check_id("swarm_id", parts[1].removeprefix("swarm_id="))
            node = check_id("node_id", parts[2].removeprefix("node_id="))
            if parts[1] == f"swarm_id={swarm}" and parts[2] == f"node_id={node}":
                return swarm, node
        if key.startswith(SWARMS_PREFIX) and len(parts) == 3 and parts[2] == "swarm.jsonl":
            swarm = check_id("swarm_id", parts[1].removeprefix("swarm_id="))
            if parts[1] == f"swarm_id={swarm}":
                return swarm, None
    except ValueError:
        return None
    return None


class IdentityIndex:
    """A reader's registry, kept up to date with the key and rules objects of a store, and
    the judge of whether a node's object is its node's."""

    name = "identities"

    def __init__(self, store: Store, check_signatures: str) -> None:
        self.store = store
        self.check_signatures = check_signatures
        """What this reader requires signed: 'swarm' (where the swarm's rules require it),
        'required' or 'off' (LedgerConfig.check_signatures)."""
        self.registry = Registry()
        self.objects: dict[str, bytes | None] = {}
        """The key and rules objects read, as read (None: unreadable): a saved index
        (ledger/reader_index.py) learns them again without reading the store."""
        self._stats: dict[str, tuple[int, str | None]] = {}
        """Local stores: (size, mtime) of each identity object when last read."""

    def refresh(self, listed: list[ObjectInfo]) -> list[str]:
        """Read key and rules objects new to the listing, or changed in it (small; a rewrite
        is refused by the registry, which pins the first reading). An object named by a
        listing or marker but missing from the store is not judged: it is read when it
        appears. Returns those keys."""
        missing: list[str] = []
        wanted = [o for o in listed if o.key.startswith((KEYS_PREFIX, SWARMS_PREFIX))]
        local = is_local(self.store)
        if local:
            # A local listing carries no version: a rewrite in place shows in a stat only
            # (one per known object, microseconds each).
            named = {o.key for o in wanted}
            wanted += [ObjectInfo(k, None) for k in self._stats if k not in named]
        for obj in wanted:
            if local:
                try:
                    seen = self.store.stat(obj.key)
                except (FileNotFoundError, NotRegularFile):
                    seen = None
                if seen is not None and self._stats.get(obj.key) == seen:
                    continue
                if seen is not None:
                    self._stats[obj.key] = seen
            most = MAX_RULES_BYTES if obj.key.startswith(SWARMS_PREFIX) else MAX_OBJECT_BYTES
            try:
                data: bytes | None = self.store.read(obj.key, most)
            except FileNotFoundError:
                missing.append(obj.key)
                continue
            except (NotRegularFile, PermissionError, OversizedObject):
                data = None  # a peer's unreadable object is skipped, never a reader's crash
            self.learn(obj.key, data)
        return missing

    def learn(self, key: str, data: bytes | None) -> None:
        if self.objects.get(key) is None:  # the first usable reading is kept
            self.objects[key] = data
        self.registry.learn(key, data)

    def rules(self) -> frozenset[tuple[str, ...]]:
        """The identity rules in force, as facts: ("key", swarm, node) for each node with a
        usable key, ("reports", swarm, node) for each node that signs its reports,
        ("signed", swarm) for each swarm whose rules (or this reader) require signatures,
        ("closed", swarm, members) for each closed swarm."""
        registry = self.registry
        facts: set[tuple[str, ...]] = {
            ("key", *place)
            for place, key in registry.keys.items()
            if isinstance(key, Ed25519PublicKey)
        }
        facts |= {("reports", *place) for place in registry.reporters}
        swarms = set(registry.rules) | registry.pinned | set(registry.pinned_members)
        for swarm in swarms:
            if registry.requires_signatures(swarm, "swarm"):
                facts.add(("signed", swarm))
            members = registry.members(swarm)
            if members is not None:
                facts.add(("closed", swarm, ",".join(sorted(members))))
        return frozenset(facts)

    def must_sign_file(self, key: str) -> bool:
        """Whether the rollout file at ``key`` must carry its node's signature."""
        place = object_place(key)
        return place is not None and self.registry.must_sign(*place, self.check_signatures)

    def vouch(self, key: str, data: bytes) -> tuple[str, str] | None:
        """Why a node log or manifest's ``data`` at ``key`` cannot be taken as its node's
        (status, detail), or None: its node is a member of its swarm (if closed) and need
        not sign, or signed exactly these bytes."""
        refused = self.registry.not_a_member(key)
        if refused is not None:
            return refused
        place = object_place(key)
        if place is None or not self.registry.must_sign_reports(*place, self.check_signatures):
            return None
        return self.registry.vouch(key, data, self.signature_of(key, data))

    def signed(
        self, key: str, data: bytes, public: Ed25519PublicKey | None
    ) -> tuple[str, str] | None:
        """Why ``data`` at ``key`` is not signed by ``public`` (None: no signature needed)."""
        if public is None:
            return None
        return judge(public, key, data, self.signature_of(key, data))

    def signature_of(self, key: str, data: bytes) -> bytes | None:
        """The signature object of ``data`` at ``key`` (named by its digest), if readable."""
        where = signature_key(key, sha256_of(data))
        try:
            return self.store.read(where, MAX_OBJECT_BYTES)
        except (FileNotFoundError, NotRegularFile, PermissionError, OversizedObject):
            return None  # a peer's unreadable object is skipped, never a reader's crash

    def state(self) -> dict[str, Any]:
        return {k: None if v is None else v.decode("latin-1") for k, v in self.objects.items()}

    def restore(self, state: dict[str, Any]) -> None:
        for key, text in state.items():
            self.learn(key, None if text is None else text.encode("latin-1"))
