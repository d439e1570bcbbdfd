"""One node's run: the round's steps (steps.py) as Prefect flows (round.py), its runtime
(runtime.py), how a run is planned and finished (plan.py), checkpoints, the backlog kept
while the ledger is down, the watchdog, and the files it keeps."""
