"""Many nodes on one machine: the launcher of node processes (launcher.py), how it stops
them (stopping.py), and the demo."""
