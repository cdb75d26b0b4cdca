"""Errors storage raises; the CLI maps them to exit codes (6: database)."""


class ProfileError(Exception):
    """A file that is missing, is not a profile, or cannot be read or written."""


class ProfileExists(ProfileError):
    """A new profile was asked for at a path that already holds a file."""


class StorageFullError(ProfileError):
    """The disk filled up while recording; checkpoints already committed are intact."""


class ProfileLocked(ProfileError):
    """Another rsprof is still recording into the file (`-a` on it is refused)."""
