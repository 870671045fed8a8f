"""The words for what the daemon cannot serve, shared by every API so each refuses alike."""

from __future__ import annotations

NO_VISION = "this model has no vision projector; send text content only"
# Replaced route by route as tool calling lands.
NO_TOOLS = "tools are not supported yet by localspec"
ONE_CHOICE = "only one choice per request is supported (n 1)"
