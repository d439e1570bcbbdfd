"""Per-node write credentials: an S3 / MinIO policy that lets a node write only its own
prefixes, and read the whole ledger.

With it a peer cannot delete or overwrite another node's files at all (signatures make such
files unreadable; credentials keep them from being touched). The policy is standard IAM JSON,
which AWS and MinIO both accept.
"""

from __future__ import annotations

import json
from typing import Any

from ledger import identity, node_logs
from ledger.changes import CHANGES_PREFIX
from ledger.keys import node_prefix
from ledger.manifests import node_manifest_prefix
from ledger.schema import check_id


def node_signed_prefixes(swarm_id: str, node_id: str) -> list[str]:
    """The prefixes of what a node writes and signs (rollouts, manifests, node logs), each
    ending in '/': its signatures lie under ``_signatures/`` + each."""
    return [
        node_prefix(swarm_id, node_id) + "/",
        node_manifest_prefix(swarm_id, node_id).rstrip("/") + "/",
        *(log.node_prefix(swarm_id, node_id) for log in node_logs.ALL),
    ]


def node_own_prefixes(swarm_id: str, node_id: str) -> list[str]:
    """Every prefix (below the ledger root) that only this node writes to."""
    signed = node_signed_prefixes(swarm_id, node_id)
    return [
        *signed,
        *(identity.SIGNATURES_PREFIX + p for p in signed),
        identity.KEYS_PREFIX + node_prefix(swarm_id, node_id) + "/",
    ]


def node_write_prefixes(swarm_id: str, node_id: str) -> list[str]:
    """Every prefix (below the ledger root) a node writes to, each ending in '/'."""
    return [
        *node_own_prefixes(swarm_id, node_id),
        # The swarm's rules: any member may be first to declare them (first writer wins).
        f"{identity.SWARMS_PREFIX}swarm_id={check_id('swarm_id', swarm_id)}/",
    ]


def node_policy(bucket: str, root: str, swarm_id: str, node_id: str) -> dict[str, Any]:
    """The IAM policy of one node: list and read everything under ``root``; write its own
    prefixes; delete only its own rollouts and signatures (compaction) and its own
    change-log markers (their collection)."""
    root = root.strip("/")
    base = f"{root}/" if root else ""
    prefixes = node_write_prefixes(swarm_id, node_id)
    writes = [f"arn:aws:s3:::{bucket}/{base}{p}*" for p in prefixes]
    # Change-log markers (ledger/changes.py) name the key they announce: only its own keys.
    writes += [f"arn:aws:s3:::{bucket}/{base}{CHANGES_PREFIX}*/{p}*" for p in prefixes]
    own = node_prefix(swarm_id, node_id) + "/"
    deletes = [
        f"arn:aws:s3:::{bucket}/{base}{own}*",
        f"arn:aws:s3:::{bucket}/{base}{identity.SIGNATURES_PREFIX}{own}*",
        # Its own old change-log markers (Ledger.collect_markers); not the swarm's rules',
        # which every member may write.
        *(
            f"arn:aws:s3:::{bucket}/{base}{CHANGES_PREFIX}*/{p}*"
            for p in node_own_prefixes(swarm_id, node_id)
        ),
    ]
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Action": ["s3:ListBucket", "s3:GetBucketLocation"],
                "Resource": [f"arn:aws:s3:::{bucket}"],
                "Condition": {"StringLike": {"s3:prefix": [f"{base}*"]}},
            },
            {
                "Effect": "Allow",
                "Action": ["s3:GetObject"],
                "Resource": [f"arn:aws:s3:::{bucket}/{base}*"],
            },
            {"Effect": "Allow", "Action": ["s3:PutObject"], "Resource": writes},
            {"Effect": "Allow", "Action": ["s3:DeleteObject"], "Resource": deletes},
        ],
    }


def minio_commands(alias: str, bucket: str, root: str, swarm_id: str, node_id: str) -> str:
    """Shell commands (MinIO's ``mc``) that create the node's policy and user."""
    name = f"sapo-{swarm_id}-{node_id}"
    policy = json.dumps(node_policy(bucket, root, swarm_id, node_id), indent=2)
    return "\n".join(
        [
            f"cat > {name}.json <<'POLICY'",
            policy,
            "POLICY",
            f"mc admin policy create {alias} {name} {name}.json",
            f'mc admin user add {alias} {name} "$(openssl rand -hex 20)"  # note the secret',
            f"mc admin policy attach {alias} {name} --user {name}",
        ]
    )
