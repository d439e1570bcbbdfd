-- `drawable`: peers' groups as this receiver would train on them, and where each falls in
-- its draw. The sampler builds it once per draw (Ledger.sample); every policy's SQL reads
-- it instead of `groups`, so that whatever a policy filters and orders by, it sees:
--
-- * Rows, not what a publisher wrapped them in (issue 57). A group's completions this
--   receiver published itself, and under a policy that takes a group once ($remember,
--   `fresh`) those its sample log says it drew in an earlier round, are not its rows here.
--   Of what is left, at most $rows_per_group rows
--   (the receiver's own group size, G), the lowest by a keyed hash of each: the publisher
--   cannot choose which. `size` and the claimed-reward columns (`reward_mean`, `_std`,
--   `_min`, `_max`) are over those rows, so claims on rows the receiver drops buy no place
--   in a draw, and a group left with fewer than two rows is not drawable at all. A padded
--   copy of the receiver's own group (its rows plus one) is one row: never drawn.
--   `kept_keys`: the completion keys kept, where that is not every row (NULL: all).
-- * An order no publisher can compute (ledger/draws.py): `u`, a number in (0, 1) from
--   SHA-256 of the draw key and what the group says (its content digest: a group's place
--   never depends on the name it is given, so grinding ids buys nothing, exactly), and
--   `peer_u`, the same of its publisher's id. The draw key is a secret of the receiver's,
--   new each round ($draw_key). Policies order by these and hash nothing themselves.
--
-- Parameters: $node_id         the receiver
--             $swarm_id        its swarm (NULL: any); its own groups are those of its id
--             $draw_key        the draw's key (32 hex digits)
--             $rows_per_group  G (NULL: no cut)
--             $remember        whether completions drawn in earlier rounds are left out
--             $node_round      the round this draw is for (NULL: every logged round)
CREATE OR REPLACE TEMP TABLE drawable AS
WITH known AS (
    SELECT unnest(completion_keys) AS k FROM groups
    WHERE node_id = $node_id AND ($swarm_id IS NULL OR swarm_id = $swarm_id)
    UNION
    SELECT TRY_CAST('0x' || unnest(string_split(completion_keys, ',')) AS UBIGINT) AS k
    FROM samples
    WHERE $remember AND node_id = $node_id AND completion_keys IS NOT NULL
      AND ($swarm_id IS NULL OR swarm_id = $swarm_id)
      AND ($node_round IS NULL OR node_round < $node_round)
),
peers AS (
    SELECT group_id, node_id, content_digest, completion_keys, claims, size FROM groups
    WHERE node_id <> $node_id
),
touched AS (
    -- Groups whose rows are not all theirs to give: some known, or more than G. Usually
    -- few: the rest keep their indexed figures as they are.
    SELECT DISTINCT group_id FROM (SELECT group_id, unnest(completion_keys) AS k FROM peers)
    SEMI JOIN known USING (k)
    UNION
    SELECT group_id FROM peers WHERE size > coalesce($rows_per_group, size)
),
fresh_rows AS (
    -- A completion the publisher sampled twice counts twice, as in its own group: `copy`
    -- numbers its rows. Nothing here depends on the names the publisher gave its rows.
    SELECT group_id, content_digest, k, claim,
        row_number() OVER (PARTITION BY group_id, k ORDER BY pos) AS copy
    FROM (
        SELECT group_id, content_digest, unnest(completion_keys) AS k, unnest(claims) AS claim,
            unnest(range(len(completion_keys))) AS pos
        FROM peers SEMI JOIN touched USING (group_id)
    ) ANTI JOIN known USING (k)
),
kept AS (
    -- Of each group, the G rows lowest by a number keyed by the receiver's secret and the
    -- row's content: which rows are kept no publisher can choose or predict.
    SELECT *, {row_u} AS row_u FROM fresh_rows
    QUALIFY $rows_per_group IS NULL
        OR row_number() OVER (PARTITION BY group_id ORDER BY row_u) <= $rows_per_group
),
recut AS (
    SELECT group_id, count(*)::INTEGER AS size, avg(claim) AS reward_mean,
        stddev_pop(claim) AS reward_std, min(claim) AS reward_min, max(claim) AS reward_max,
        list(k ORDER BY k) AS kept_keys
    FROM kept GROUP BY group_id
),
peer_order AS (
    SELECT node_id, {peer_u} AS peer_u FROM (SELECT DISTINCT node_id FROM peers)
)
SELECT g.group_id, g.swarm_id, g.node_id, g.model_id, g.task, g.node_round,
    g.policy_version, g.published_at, g.first_seen, g.content_digest,
    coalesce(r.size, g.size) AS size,
    CASE WHEN t.group_id IS NULL THEN g.reward_mean ELSE r.reward_mean END AS reward_mean,
    CASE WHEN t.group_id IS NULL THEN g.reward_std ELSE r.reward_std END AS reward_std,
    CASE WHEN t.group_id IS NULL THEN g.reward_min ELSE r.reward_min END AS reward_min,
    CASE WHEN t.group_id IS NULL THEN g.reward_max ELSE r.reward_max END AS reward_max,
    r.kept_keys, {group_u} AS u, p.peer_u
FROM groups g
    LEFT JOIN touched t USING (group_id)
    LEFT JOIN recut r USING (group_id)
    JOIN peer_order p USING (node_id)
WHERE g.node_id <> $node_id AND (t.group_id IS NULL OR r.size >= 2)
