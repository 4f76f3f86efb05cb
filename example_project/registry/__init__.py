"""The second service: a registry of published test suites, receiving them from the outbox's relays."""
