"""Real services for the tests: PostgreSQL databases, an HTTP receiver, Azurite."""
