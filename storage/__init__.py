"""Profile storage: the SQLite schema, the writer and every query."""
