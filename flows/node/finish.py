"""How a node's run finishes, in one place and in this order: the final evaluation (once the
swarm's last round has run), its model logged to MLflow (when due), what it keeps on disk
(`checkpoint_keep`), its MLflow run closed, and the node marked finished. `node_flow` calls
`finish_run` after its rounds; the rules each step asks are flows/node/lifecycle.py's."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from flows.node import checkpoint, lifecycle, steps
from flows.node.runtime import NodeRuntime, model_path
from sapo_core.prompts import serving_template, stop_texts

log = logging.getLogger(__name__)


def finish_run(
    node: NodeRuntime,
    *,
    until_round: int | None,
    ran_rounds: bool,
    evaluate: Callable[[NodeRuntime], Any] = steps.final_evaluation,
    entering: Callable[[str], None] = lambda _: None,
) -> bool:
    """Finish a run of ``node`` that ran rounds (``ran_rounds``) up to ``until_round``;
    whether the node is now finished (marked so: later runs have nothing to do).
    ``evaluate`` scores the final policy (the flow passes its Prefect task); ``entering``
    is told each phase (the watchdog's)."""
    swarm = node.swarm
    entering("the final evaluation")
    at_end = lifecycle.reached_the_end(node.next_round, swarm.rounds)
    if at_end and not steps.evaluated(node, swarm.rounds):
        # After the last checkpoint, so the score is that checkpoint's; a node killed
        # before it is scored by the next run, whose loop is then empty.
        evaluate(node)
    entering("closing the node's run (logging its model)")
    log_model = lifecycle.logs_its_model(
        log_models=swarm.logs_models,
        next_round=node.next_round,
        rounds=swarm.rounds,
        until_round=until_round,
        ran_rounds=ran_rounds,
        model_missing=node.final_model_missing,
    )
    close_run(node, log_model=log_model)
    if lifecycle.finished(node.next_round, swarm.rounds, node.tracking_incomplete):
        checkpoint.mark_finished(swarm.workdir, node.node_id, node.next_round)
        return True
    return False


def close_run(node: NodeRuntime, *, log_model: bool) -> None:
    """Close the node's run; log its final model (the newest checkpoint). A node done with
    its rounds under `checkpoint_keep: final-model` then keeps only that model: in MLflow
    when it was logged there, else in its checkpoint directory; under `nothing`, only the
    record that it finished (and the model in MLflow if logged)."""
    node.wait_for_checkpoint()
    saved = checkpoint.latest(node.workdir, node.node_id)
    if saved is not None:
        logged_at = None
        if node.run is not None and log_model:
            # The policy in memory is the newest checkpoint's (saved after the last
            # update); only the model goes, the optimizer state would triple it.
            policy = node.learner.policy
            logged_at = node.run.tracker.log_model(
                node.run.run_id,
                policy.model,
                policy.tokenizer,
                scratch=saved.path.parent,
                path=model_path(saved.next_round),
                # Served, it is prompted as the node trained it.
                prompt_template=serving_template(
                    policy.tokenizer, node.learner.config.prompt, node.learner.prompt_format
                ),
                stop=stop_texts(node.learner.prompt_format),
            )
        keep = node.swarm.checkpoint_keep
        at_end = lifecycle.reached_the_end(saved.next_round, node.swarm.rounds)
        if at_end and saved.resumable and keep != "resume":
            kept = checkpoint.keep_final_model(saved, logged_at, weights=keep == "final-model")
            where = logged_at or (kept.path if keep == "final-model" else "nowhere")
            log.info("%s keeps %s; its final model: %s", node.node_id, keep, where)
    node.log_unlogged()
    if node.run is not None:
        node.run.tracker.finish(node.run.run_id)
