"""What the swarm file and the command line share (bounds, defaults, help texts), in a
module light enough for the command line to import before it parses anything."""

from ledger.config import DEFAULT_WORKDIR

__all__ = ["CHECKPOINT_KEEP_HELP", "DEFAULT_WORKDIR", "MAX_NODES"]

MAX_NODES = 256
"""Most nodes one swarm runs (a swarm file's `nodes` or `node_count`, `--nodes`)."""

CHECKPOINT_KEEP_HELP = (
    "What a node keeps when it finishes its rounds: 'resume' (its newest checkpoint: weights, "
    "optimizer and RNG state, so --rounds N continues it), 'final-model' (the final fp32 model "
    "only: in MLflow when it was logged there, else in its checkpoint directory; a third of "
    "the disk, and the swarm cannot be continued) or 'nothing' (no model, on disk or in "
    "MLflow unless tracking.log_models is set true: only the record that it finished; for "
    "sweeps that compare metrics, whose models would fill a disk: 40 runs of 3 nodes keep "
    "65 GB at 135M)."
)
"""`checkpoint_keep`'s help, the swarm file's and `--keep`'s."""
