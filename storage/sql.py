"""`rsprof query`: user SQL on a read-only connection."""

from __future__ import annotations

import os
import sqlite3

from rsprof.storage.errors import ProfileError
from rsprof.storage.reader import connect_readonly
from rsprof.storage.schema import create_views


def run_query(
    path: str | os.PathLike[str], sql: str
) -> tuple[list[str], list[tuple[object, ...]]]:
    """Column names and rows; a write (or any SQL error) raises ProfileError, file untouched."""
    conn = connect_readonly(path)
    try:
        create_views(conn, temporary=True)  # files written before the views existed
        cursor = conn.execute(sql)
        columns = [d[0] for d in cursor.description] if cursor.description else []
        return columns, cursor.fetchall()
    except sqlite3.OperationalError as error:
        if "readonly" in str(error):
            raise ProfileError(
                f"{path}: `rsprof query` is read-only; the statement would write ({error})"
            ) from error
        raise ProfileError(f"SQL error: {error}") from error
    except sqlite3.Error as error:
        raise ProfileError(f"SQL error: {error}") from error
    finally:
        conn.close()
