-- Variance-weighted sampling (not in the paper): draw peers' groups with probability
-- proportional to the variance of their claimed rewards, fairly across peers
-- (fair_draw.sql), optionally only recent ones.
--
-- Why: a GRPO group's advantages scale with its reward spread, so a group where every
-- completion agrees teaches nothing and one split half/half teaches most. At high J the
-- external share dominates a node's gradient; the paper's uniform draw then leans on
-- whichever peers publish most, weak or stale, and training oscillates. Weighting by
-- variance spends the J slots on the groups GRPO learns most from, and the per-peer cap
-- keeps one peer from flooding the batch.
--
-- The draw is a weighted sample without replacement (Efraimidis & Spirakis 2006): each
-- candidate gets key ln(u) / w with u uniform in (0, 1) (`drawable`'s, keyed by the
-- receiver's secret), and the largest keys win: its draw is -ln(u) / w, lowest first, as
-- fair_draw.sql takes them. The variance is of the claims on the rows the receiver would
-- keep, so claims on rows it drops widen nothing.
--
-- Parameters: $node_id, $swarm_id, $excluded, $tasks as in paper.sql, and
--             $min_std       smallest reward standard deviation kept (0: drop only groups
--                            whose rewards all agree)
--             $max_age_s, $now   recency window (NULL: no window), by the
--                 earlier of the publisher's stamp and this reader's first sight
WITH candidates AS (
    SELECT group_id, node_id, content_digest,
           -ln(u) / (reward_std * reward_std) AS draw
    FROM drawable
    WHERE node_id <> $node_id
      AND NOT list_contains($excluded::VARCHAR[], node_id)
      AND ($swarm_id IS NULL OR swarm_id = $swarm_id)
      AND ($tasks IS NULL OR list_contains($tasks::VARCHAR[], task))
      AND reward_max > reward_min
      AND reward_std > $min_std
      AND ($max_age_s IS NULL OR least(published_at, first_seen) >= $now - to_microseconds(CAST($max_age_s * 1e6 AS BIGINT)))
)
