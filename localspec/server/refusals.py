"""The words for what the daemon cannot serve, shared by every API so each refuses alike."""

from __future__ import annotations

NO_VISION = "this model has no vision projector; send text content only"
NO_AUDIO = "this daemon answers in text only (no audio model); ask for text"
NO_WEB_SEARCH = "web search is a hosted tool this daemon does not have; send the pages in the prompt"
