"""The daemon's process: its pidfile and lock, the watch that ends a private daemon with its parent,
and the memory it may take (within a container's limit).

Shared by the daemon and by whoever starts or finds one (the CLI, the TUI).
"""
