"""The chat's widgets, one per module."""
