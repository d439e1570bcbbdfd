"""One node's run: the round's steps (steps.py) as Prefect flows (round.py), its runtime
(runtime.py), its lifecycle (lifecycle.py: whether it may resume, which rounds a run runs,
how it finishes), checkpoints, the backlog kept while the ledger is down, the watchdog, and
the files it keeps."""
