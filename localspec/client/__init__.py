"""The Python client of the daemon's API, as the TUI and `generate --remote` use it."""

from localspec.client.http import DEFAULT_MODEL, Client, EventStream, Health, StreamEvent
from localspec.client.loaded import LoadedModel
from localspec.client.streamabort import StreamAbort

__all__ = ["DEFAULT_MODEL", "Client", "EventStream", "Health", "LoadedModel", "StreamAbort", "StreamEvent"]
