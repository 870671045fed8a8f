"""The chat's modal screens, one per module."""
