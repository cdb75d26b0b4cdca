"""The recorder: attach to a process, follow its threads and mappings, symbolize, checkpoint."""
