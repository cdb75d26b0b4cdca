"""The TUI's widgets."""
