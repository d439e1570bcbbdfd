"""`python -m flows.cli`: what the swarm launcher runs for each node."""

from flows.cli import main

main()
