"""The localspec chat TUI (Textual). Talks to the engine only through localspec.client."""
