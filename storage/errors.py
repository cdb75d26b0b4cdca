"""Errors storage raises; the CLI maps them to exit codes (6: database)."""


class ProfileError(Exception):
    """A file that is missing, is not a profile, or cannot be read or written."""


class StorageFullError(ProfileError):
    """The disk filled up while recording; checkpoints already committed are intact."""
