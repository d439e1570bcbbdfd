"""Bounds that the swarm file and the command line share, in a module light enough for the
command line to import before it parses anything."""

MAX_NODES = 256
"""Most nodes one swarm runs (a swarm file's `nodes` or `node_count`, `--nodes`)."""
