"""rsprof."""
