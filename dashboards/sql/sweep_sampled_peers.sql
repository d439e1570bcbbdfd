-- Who sampled whom: how many groups each node (receiver) drew from each peer, per swarm.
-- `samples` is the sample log; see most_sampled_peers.sql for its plain-DuckDB view.
SELECT
    swarm_id,
    node_id            AS receiver,
    peer_node_id       AS peer,
    count(*)           AS groups_drawn
FROM samples
GROUP BY ALL
ORDER BY swarm_id, receiver, peer;
