"""Integrations with other frameworks (optional extras)."""
