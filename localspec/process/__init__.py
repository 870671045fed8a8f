"""The daemon's process: its pidfile and lock, and the watch that ends a private daemon with its parent.

Shared by the daemon and by whoever starts or finds one (the CLI, the TUI).
"""
