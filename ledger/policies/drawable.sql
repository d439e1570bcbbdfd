-- `drawable`: peers' groups as this receiver would train on them, and where each falls in
-- its draw. The sampler builds it once per draw (Ledger.sample); every policy's SQL reads
-- it instead of `groups`, so that whatever a policy filters and orders by, it sees:
--
-- * An order no publisher can compute (ledger/draws.py): `u`, a number in (0, 1) from
--   MD5 of the draw key and what the group says (its content digest: a group's place
--   never depends on the name it is given, so grinding ids buys nothing, exactly), and
--   `peer_u`, the same of its publisher's id. The draw key is a secret of the receiver's,
--   new each round ($draw_key). Policies order by these and hash nothing themselves.
-- * Rows, not what a publisher wrapped them in (issue 57; the statements after the
--   first). A group's completions this receiver published itself, and under a policy
--   that takes a group once ($remember, `fresh`) those its sample log says it drew in an
--   earlier round, are not its rows here. Of what is left, at most $rows_per_group rows
--   (the receiver's own group size, G), the lowest by a keyed hash of each: the
--   publisher cannot choose which.
--   `size` and the claimed-reward columns (`reward_mean`, `_std`, `_min`, `_max`) are over
--   those rows, so claims on rows the receiver drops buy no place in a draw, and a group
--   left with fewer than two rows is not drawable at all. A padded copy of the receiver's
--   own group (its rows plus one) is one row: never drawn. `kept_keys`: the completion
--   keys kept, where that is not every row (NULL: all).
--
-- Parameters: $node_id         the receiver
--             $swarm_id        its swarm (NULL: any); its own groups are those of its id
--             $tasks, $excluded  tasks it judges (NULL: any), peers it no longer samples
--             $draw_key        the draw's key (32 hex digits)
--             $rows_per_group  G (NULL: no cut)
--             $remember        whether completions drawn in earlier rounds are left out
--             $node_round      the round this draw is for (NULL: every logged round)
--
-- The recut (the statements after the first) changes nothing when no group holds a
-- completion the receiver must not get and none is longer than G: the sampler stops at
-- its check then.
CREATE OR REPLACE TEMP TABLE drawable AS
WITH candidates AS (
    -- What any policy may draw: peers' groups of this swarm, of tasks the receiver judges,
    -- of peers it has not excluded. (Named columns: the lists stay where they are.)
    SELECT group_id, swarm_id, node_id, task, published_at, first_seen, content_digest, size,
        reward_mean, reward_std, reward_min, reward_max
    FROM groups
    WHERE node_id <> $node_id
      AND ($swarm_id IS NULL OR swarm_id = $swarm_id)
      AND ($tasks IS NULL OR list_contains($tasks::VARCHAR[], task))
      AND NOT list_contains($excluded::VARCHAR[], node_id)
),
peer_order AS (
    SELECT node_id, {peer_u} AS peer_u FROM (SELECT DISTINCT node_id FROM candidates)
)
SELECT g.*, NULL::UUID[] AS kept_keys, {group_u} AS u, p.peer_u
FROM candidates g JOIN peer_order p USING (node_id);

-- The completions this receiver must not be handed: its own, and (remembering) those its
-- sample log says it drew in an earlier round.
CREATE OR REPLACE TEMP TABLE drawable_known AS
SELECT unnest(completion_keys) AS k FROM groups
WHERE node_id = $node_id AND ($swarm_id IS NULL OR swarm_id = $swarm_id)
UNION
SELECT TRY_CAST(unnest(string_split(completion_keys, ',')) AS UUID) AS k
FROM samples
WHERE $remember AND node_id = $node_id AND completion_keys IS NOT NULL
  AND ($swarm_id IS NULL OR swarm_id = $swarm_id)
  AND ($node_round IS NULL OR node_round < $node_round);

-- Whether any group is not wholly its publisher's to give (the sampler stops here if not).
SELECT EXISTS (
    SELECT 1 FROM (
        SELECT unnest(completion_keys) AS k FROM groups SEMI JOIN drawable USING (group_id)
    ) SEMI JOIN drawable_known USING (k)
) OR EXISTS (SELECT 1 FROM drawable WHERE size > coalesce($rows_per_group, size));

UPDATE drawable SET size = coalesce(r.size, 0), reward_mean = r.reward_mean,
    reward_std = r.reward_std, reward_min = r.reward_min, reward_max = r.reward_max,
    kept_keys = coalesce(r.kept_keys, [])
FROM (
    WITH peers AS (
        SELECT group_id, content_digest, completion_keys, claims, size FROM groups
        SEMI JOIN drawable USING (group_id)
    ),
    touched AS (
        -- Groups whose rows are not all theirs to give: some known, or more than G.
        SELECT DISTINCT group_id FROM (
            SELECT group_id, unnest(completion_keys) AS k FROM peers
        ) SEMI JOIN drawable_known USING (k)
        UNION
        SELECT group_id FROM peers WHERE size > coalesce($rows_per_group, size)
    ),
    fresh_rows AS (
        -- A completion the publisher sampled twice counts twice, as in its own group:
        -- `copy` numbers its rows. Nothing here depends on the names the publisher gave
        -- its rows.
        SELECT group_id, content_digest, k, claim,
            row_number() OVER (PARTITION BY group_id, k ORDER BY pos) AS copy
        FROM (
            SELECT group_id, content_digest, unnest(completion_keys) AS k,
                unnest(claims) AS claim, unnest(range(len(completion_keys))) AS pos
            FROM peers SEMI JOIN touched USING (group_id)
        ) ANTI JOIN drawable_known USING (k)
    ),
    kept AS (
        -- Of each group, the G rows lowest by a number keyed by the receiver's secret and
        -- the row's content: which rows are kept no publisher can choose or predict.
        SELECT *, {row_u} AS row_u FROM fresh_rows
        QUALIFY $rows_per_group IS NULL
            OR row_number() OVER (PARTITION BY group_id ORDER BY row_u) <= $rows_per_group
    ),
    recut AS (
        SELECT group_id, count(*)::INTEGER AS size, avg(claim) AS reward_mean,
            stddev_pop(claim) AS reward_std, min(claim) AS reward_min,
            max(claim) AS reward_max, list(k ORDER BY k) AS kept_keys
        FROM kept GROUP BY group_id
    )
    SELECT * FROM touched LEFT JOIN recut USING (group_id)
) r
WHERE drawable.group_id = r.group_id;

DELETE FROM drawable WHERE kept_keys IS NOT NULL AND len(kept_keys) < 2
