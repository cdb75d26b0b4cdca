"""Unit tests: synthetic data, no process started, milliseconds each (issue 25, item 5)."""
