"""The words for what the daemon cannot serve, shared by every API so each refuses alike."""

from __future__ import annotations

NO_VISION = "this model has no vision projector; send text content only"
