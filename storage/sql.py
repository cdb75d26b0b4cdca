"""`rsprof query`: user SQL on a read-only, sandboxed connection, rows streamed.

The SQL is the user's, but the file system is not theirs to reach through it: `query`
touches nothing but the profile, whatever the statement (docs/schema.md, "rsprof query").

- The file is opened read-only (`mode=ro` URI): no write reaches it.
- `SQLITE_LIMIT_ATTACHED` is 0: no `ATTACH` (which creates files anywhere), and no
  `VACUUM` / `VACUUM INTO` (which attach their output database internally).
- An authorizer allows reading only: `SELECT`, reads of tables and columns, functions
  (except `load_extension` and `fts3_tokenizer`), recursive CTEs, transactions, and the
  pragmas that only report. Every write (temporary tables included), `ATTACH`/`DETACH`,
  pragma assignments and schema changes are refused with "not authorized".
- A progress handler polls an interrupt flag, so Ctrl-C (the CLI's signal handler calls
  `interrupt()`) stops even a runaway recursive CTE.
- Rows come from a cursor in batches: the first row is out before the last is computed.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator

from rsprof.storage.errors import ProfileError
from rsprof.storage.reader import connect_readonly
from rsprof.storage.schema import create_views

_ALLOWED_ACTIONS = {
    sqlite3.SQLITE_SELECT,
    sqlite3.SQLITE_READ,
    sqlite3.SQLITE_TRANSACTION,
    sqlite3.SQLITE_SAVEPOINT,
    sqlite3.SQLITE_RECURSIVE,
}
# Functions that reach outside the database (extensions are also disabled on the
# connection; this is the second lock).
_DENIED_FUNCTIONS = {"load_extension", "fts3_tokenizer"}
# Pragmas that only report, with or without an argument (a table or index name).
_READ_PRAGMAS_WITH_ARG = {
    "table_info", "table_xinfo", "table_list", "index_list", "index_info", "index_xinfo",
    "foreign_key_list", "foreign_key_check", "integrity_check", "quick_check",
}
# Pragmas that report when given no value (with one they would set something).
_READ_PRAGMAS = {
    "application_id", "collation_list", "compile_options", "data_version", "database_list",
    "encoding", "freelist_count", "function_list", "journal_mode", "module_list",
    "page_count", "page_size", "pragma_list", "schema_version", "user_version",
    "auto_vacuum", "cache_size", "foreign_keys", "max_page_count", "synchronous",
}
# VM instructions between two looks at the interrupt flag (~1 ms of work).
_PROGRESS_STEPS = 10_000
_BATCH = 1000


class QueryInterrupted(ProfileError):
    """The query was interrupted (Ctrl-C)."""


def _authorize(action: int, arg1: str | None, arg2: str | None, _db: str | None,
               _trigger: str | None) -> int:
    if action in _ALLOWED_ACTIONS:
        return sqlite3.SQLITE_OK
    if action == sqlite3.SQLITE_UPDATE and arg1 == "sqlite_master" and _db == "main":
        # Asked while preparing table-valued pragmas (pragma_table_info('meta')); the main
        # database is opened read-only, so nothing can be written to it anyway.
        return sqlite3.SQLITE_OK
    if action == sqlite3.SQLITE_FUNCTION:
        denied = (arg2 or "").lower() in _DENIED_FUNCTIONS
        return sqlite3.SQLITE_DENY if denied else sqlite3.SQLITE_OK
    if action == sqlite3.SQLITE_PRAGMA:
        name = (arg1 or "").lower()
        if name in _READ_PRAGMAS_WITH_ARG or (name in _READ_PRAGMAS and arg2 is None):
            return sqlite3.SQLITE_OK
    return sqlite3.SQLITE_DENY


class Query:
    """One user statement on its own sandboxed connection; iterate `rows()` once."""

    def __init__(self, path: str | os.PathLike[str], sql: str) -> None:
        self.path = path
        self._interrupted = False
        self.conn = connect_readonly(path)
        try:
            create_views(self.conn, temporary=True)  # files written before the views existed
            self.conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
            self.conn.set_authorizer(_authorize)
            self.conn.set_progress_handler(self._progress, _PROGRESS_STEPS)
        except sqlite3.Error as error:
            self.conn.close()
            raise self._error(error) from error
        self.sql = sql
        self.columns: list[str] = []
        self.cursor: sqlite3.Cursor | None = None

    def execute(self) -> list[str]:
        """Prepares and starts the statement (a sort may run to its end here); returns the
        column names. Interruptible: install the signal handler before calling this."""
        try:
            self.cursor = self.conn.execute(self.sql)
        except sqlite3.Error as error:
            self.conn.close()
            raise self._error(error) from error
        except BaseException:
            self.conn.close()
            raise
        description = self.cursor.description
        self.columns = [d[0] for d in description] if description else []
        return self.columns

    def interrupt(self) -> None:
        """Safe from a signal handler: the running statement stops within ~1 ms."""
        self._interrupted = True

    def _progress(self) -> int:
        return 1 if self._interrupted else 0

    def _error(self, error: sqlite3.Error) -> ProfileError:
        text = str(error)
        if self._interrupted or text == "interrupted":
            return QueryInterrupted("query interrupted")
        if "readonly" in text or "not authorized" in text or "authorization denied" in text:
            return ProfileError(
                f"{self.path}: `rsprof query` is read-only and reads only the profile; the"
                f" statement would write or reach outside it ({text})"
            )
        if "too many attached databases" in text:
            return ProfileError(
                f"{self.path}: `rsprof query` reads only the profile: no ATTACH or VACUUM ({text})"
            )
        return ProfileError(f"SQL error: {text}")

    def rows(self) -> Iterator[tuple[object, ...]]:
        """Rows as SQLite produces them, in batches; the connection is closed at the end."""
        if self.cursor is None:
            self.execute()
        assert self.cursor is not None
        try:
            while True:
                try:
                    batch = self.cursor.fetchmany(_BATCH)
                except sqlite3.Error as error:
                    raise self._error(error) from error
                if not batch:
                    return
                yield from batch
        finally:
            self.close()

    def close(self) -> None:
        self.conn.close()


def run_query(
    path: str | os.PathLike[str], sql: str
) -> tuple[list[str], list[tuple[object, ...]]]:
    """Column names and all rows (for callers that want a list); see Query to stream."""
    query = Query(path, sql)
    columns = query.execute()
    return columns, list(query.rows())
