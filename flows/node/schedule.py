"""A deployed node's schedule, seen from its run: the run that finds its node finished
pauses the schedule (flows/services/deploy.py registers it)."""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def pause_own_deployment(node_id: str) -> bool:
    """Pause the schedule of the deployment whose run this is (its node has finished):
    Prefect then deletes the runs it scheduled ahead, and no later interval starts a
    process only to say "finished". Whether a schedule was paused (False outside a
    deployment's run, or when the server did not answer: the node's next run, which
    finds it finished at once, tries again)."""
    from prefect.client.orchestration import get_client
    from prefect.runtime import deployment

    try:
        deployment_id = deployment.id  # may ask the server
        if not deployment_id:
            return False
        with get_client(sync_client=True) as client:
            client.pause_deployment(deployment_id)
    except Exception as exc:  # the node's work is done: say it and go on
        log.warning("%s has finished, but its schedule was not paused: %s", node_id, exc)
        return False
    log.info("%s has finished: its deployment's schedule is paused", node_id)
    return True
