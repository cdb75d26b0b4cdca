"""The profile file's schema. docs/schema.md documents every table created here."""

from __future__ import annotations

import sqlite3

SCHEMA_VERSION = 2
# Versions the readers understand. Schema 1 stored the heap four times (per stack, process,
# thread and call site); schema 2 keeps one delta table and the call site per stack
# (heap_deltas, heap_call_sites), the old tables' names being views over them.
READABLE_SCHEMA_VERSIONS = ("1", "2")

# SQLite integers are signed 64-bit; addresses, offsets and counters are unsigned 64-bit
# (return addresses >= 2^63 occur, and so does [vsyscall] at 0xffffffffff600000). One
# mapping for every such column: stored as the two's-complement signed value, read back
# with `& 0xFFFFFFFFFFFFFFFF` (SQL: `address & 0xFFFFFFFFFFFFFFFF` does not help, SQLite
# has no unsigned type; compare with `printf('%x', address)` or convert in the client).
_U64_MASK = (1 << 64) - 1
_I64_SPAN = 1 << 64


def u64_to_sql(value: int) -> int:
    """An unsigned 64-bit value as the signed 64-bit integer SQLite stores."""
    value &= _U64_MASK
    return value - _I64_SPAN if value >= 1 << 63 else value


def u64_from_sql(value: int) -> int:
    """The unsigned 64-bit value behind a stored signed integer (inverse of u64_to_sql)."""
    return value & _U64_MASK

DDL = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS checkpoints (
    id INTEGER PRIMARY KEY,
    timestamp_ms INTEGER NOT NULL,
    samples INTEGER NOT NULL DEFAULT 0,
    lost_samples INTEGER NOT NULL DEFAULT 0,
    heap_events INTEGER NOT NULL DEFAULT 0,
    heap_lost_events INTEGER NOT NULL DEFAULT 0,
    target_cpu_pct REAL,
    target_rss_bytes INTEGER
);
CREATE TABLE IF NOT EXISTS target_output (
    id INTEGER PRIMARY KEY,
    time_ms INTEGER NOT NULL,
    stream TEXT NOT NULL CHECK (stream IN ('stdout', 'stderr')),
    data BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS modules (
    id INTEGER PRIMARY KEY,
    path TEXT NOT NULL,
    build_id TEXT,
    UNIQUE (path, build_id)
);
CREATE TABLE IF NOT EXISTS mappings (
    id INTEGER PRIMARY KEY,
    module_id INTEGER NOT NULL REFERENCES modules(id),
    start INTEGER NOT NULL,
    "end" INTEGER NOT NULL,
    file_offset INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS locations (
    id INTEGER PRIMARY KEY,
    function TEXT NOT NULL,
    file TEXT NOT NULL DEFAULT '',
    line INTEGER NOT NULL DEFAULT 0,
    module_id INTEGER REFERENCES modules(id),
    system_name TEXT,
    UNIQUE (file, line, function, module_id)
);
CREATE TABLE IF NOT EXISTS frames (
    id INTEGER PRIMARY KEY,
    address INTEGER NOT NULL,
    module_id INTEGER REFERENCES modules(id),
    module_offset INTEGER
);
CREATE TABLE IF NOT EXISTS frame_locations (
    frame_id INTEGER NOT NULL REFERENCES frames(id),
    inline_depth INTEGER NOT NULL,
    location_id INTEGER NOT NULL REFERENCES locations(id),
    PRIMARY KEY (frame_id, inline_depth)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS stacks (id INTEGER PRIMARY KEY, depth INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS stack_frames (
    stack_id INTEGER NOT NULL REFERENCES stacks(id),
    position INTEGER NOT NULL,
    frame_id INTEGER NOT NULL REFERENCES frames(id),
    PRIMARY KEY (stack_id, position)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS threads (
    tid INTEGER PRIMARY KEY,
    name TEXT,
    comm TEXT,
    first_checkpoint_id INTEGER,
    last_checkpoint_id INTEGER,
    exited INTEGER NOT NULL DEFAULT 0,
    pid INTEGER
);
CREATE TABLE IF NOT EXISTS processes (
    id INTEGER PRIMARY KEY,
    pid INTEGER NOT NULL,
    ppid INTEGER,
    parent_id INTEGER REFERENCES processes(id),
    command TEXT,
    first_checkpoint_id INTEGER,
    exited INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS cpu_stack_samples (
    checkpoint_id INTEGER NOT NULL REFERENCES checkpoints(id),
    stack_id INTEGER NOT NULL REFERENCES stacks(id),
    tid INTEGER NOT NULL,
    count INTEGER NOT NULL,
    PRIMARY KEY (checkpoint_id, stack_id, tid)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS cpu_samples (
    checkpoint_id INTEGER NOT NULL REFERENCES checkpoints(id),
    location_id INTEGER NOT NULL REFERENCES locations(id),
    count INTEGER NOT NULL,
    PRIMARY KEY (checkpoint_id, location_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS heap_deltas (
    checkpoint_id INTEGER NOT NULL REFERENCES checkpoints(id),
    stack_id INTEGER NOT NULL REFERENCES stacks(id),
    pid INTEGER NOT NULL,
    tid INTEGER NOT NULL,
    alloc_bytes INTEGER NOT NULL DEFAULT 0,
    alloc_count INTEGER NOT NULL DEFAULT 0,
    free_bytes INTEGER NOT NULL DEFAULT 0,
    free_count INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (checkpoint_id, stack_id, pid, tid)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS heap_call_sites (
    stack_id INTEGER PRIMARY KEY REFERENCES stacks(id),
    position INTEGER NOT NULL,
    inline_depth INTEGER NOT NULL,
    location_id INTEGER NOT NULL REFERENCES locations(id)
);
CREATE INDEX IF NOT EXISTS cpu_samples_location ON cpu_samples (location_id);
CREATE INDEX IF NOT EXISTS heap_call_sites_location ON heap_call_sites (location_id);
CREATE VIEW IF NOT EXISTS heap_stack_samples AS
SELECT checkpoint_id, stack_id, SUM(alloc_bytes) AS alloc_bytes,
       SUM(alloc_count) AS alloc_count, SUM(free_bytes) AS free_bytes,
       SUM(free_count) AS free_count
FROM heap_deltas GROUP BY checkpoint_id, stack_id;
CREATE VIEW IF NOT EXISTS heap_process_samples AS
SELECT checkpoint_id, pid, stack_id, SUM(alloc_bytes) AS alloc_bytes,
       SUM(alloc_count) AS alloc_count, SUM(free_bytes) AS free_bytes,
       SUM(free_count) AS free_count
FROM heap_deltas GROUP BY checkpoint_id, pid, stack_id;
CREATE VIEW IF NOT EXISTS heap_thread_samples AS
SELECT checkpoint_id, tid, pid, stack_id, alloc_bytes, alloc_count, free_bytes, free_count
FROM heap_deltas;
CREATE VIEW IF NOT EXISTS heap_site_samples AS
SELECT checkpoint_id, location_id, alloc_bytes, alloc_count, free_bytes, free_count,
       SUM(alloc_bytes - free_bytes)
           OVER (PARTITION BY location_id ORDER BY checkpoint_id) AS live_bytes
FROM (SELECT d.checkpoint_id AS checkpoint_id, s.location_id AS location_id,
             SUM(d.alloc_bytes) AS alloc_bytes, SUM(d.alloc_count) AS alloc_count,
             SUM(d.free_bytes) AS free_bytes, SUM(d.free_count) AS free_count
      FROM heap_deltas d JOIN heap_call_sites s ON s.stack_id = d.stack_id
      GROUP BY d.checkpoint_id, s.location_id);
CREATE VIEW IF NOT EXISTS heap_samples AS
SELECT s.location_id AS location_id,
       l.function AS function,
       l.file AS file,
       l.line AS line,
       SUM(d.alloc_bytes) AS total_alloc_bytes,
       SUM(d.free_bytes) AS total_free_bytes,
       SUM(d.alloc_count) AS total_allocs,
       SUM(d.free_count) AS total_frees,
       SUM(d.alloc_bytes) - SUM(d.free_bytes) AS live_bytes,
       MAX(d.checkpoint_id) AS last_checkpoint_id
FROM heap_deltas d JOIN heap_call_sites s ON s.stack_id = d.stack_id
JOIN locations l ON l.id = s.location_id
GROUP BY s.location_id;
"""

# Views for the common questions, for any SQLite client (docs/schema.md, "Views"). Kept
# apart from DDL so `rsprof query` can add them as TEMP views to files written before them.
VIEWS = {
    "cpu_functions": """
SELECT sfn.function AS function,
       COALESCE(m.path, '') AS module,
       COALESCE(SUM(CASE WHEN lf.stack_id IS NOT NULL THEN sc.samples END), 0) AS self,
       ROUND(100.0 * COALESCE(SUM(CASE WHEN lf.stack_id IS NOT NULL THEN sc.samples END), 0)
             / (SELECT MAX(1, SUM(count)) FROM cpu_stack_samples), 2) AS self_pct,
       SUM(sc.samples) AS total,
       ROUND(100.0 * SUM(sc.samples)
             / (SELECT MAX(1, SUM(count)) FROM cpu_stack_samples), 2) AS total_pct
FROM (SELECT DISTINCT sf.stack_id, l.function, l.module_id
      FROM stack_frames sf
      JOIN frame_locations fl ON fl.frame_id = sf.frame_id
      JOIN locations l ON l.id = fl.location_id) AS sfn
JOIN (SELECT stack_id, SUM(count) AS samples FROM cpu_stack_samples GROUP BY stack_id) AS sc
  ON sc.stack_id = sfn.stack_id
LEFT JOIN (SELECT sf.stack_id, l.function, l.module_id
           FROM stack_frames sf
           JOIN frame_locations fl ON fl.frame_id = sf.frame_id AND fl.inline_depth = 0
           JOIN locations l ON l.id = fl.location_id
           WHERE sf.position = 0) AS lf
  ON lf.stack_id = sfn.stack_id AND lf.function = sfn.function
     AND lf.module_id IS sfn.module_id
LEFT JOIN modules m ON m.id = sfn.module_id
GROUP BY sfn.function, sfn.module_id""",
    "cpu_threads": """
SELECT t.tid AS tid,
       t.name AS name,
       COALESCE(SUM(c.count), 0) AS samples,
       ROUND(100.0 * COALESCE(SUM(c.count), 0)
             / (SELECT MAX(1, SUM(count)) FROM cpu_stack_samples), 2) AS pct,
       t.exited AS exited
FROM threads t LEFT JOIN cpu_stack_samples c ON c.tid = t.tid
GROUP BY t.tid""",
    # over heap_samples, which both schema versions have (schema 1: over its per-site table)
    "heap_sites": """
SELECT function, file, line,
       total_alloc_bytes AS alloc_bytes,
       total_allocs AS allocs,
       total_free_bytes AS free_bytes,
       total_frees AS frees,
       total_alloc_bytes - total_free_bytes AS leaked_bytes,
       total_allocs - total_frees AS leaked_count
FROM heap_samples""",
}


def create_views(conn: sqlite3.Connection, *, temporary: bool = False) -> None:
    """Creates the VIEWS that do not exist yet (as TEMP views on a read-only connection)."""
    existing = {
        name
        for (name,) in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'view'"
            " UNION SELECT name FROM sqlite_temp_master WHERE type = 'view'"
        )
    }
    kind = "TEMP VIEW" if temporary else "VIEW"
    for name, body in VIEWS.items():
        if name not in existing:
            conn.execute(f"CREATE {kind} {name} AS {body}")


def create_schema(conn: sqlite3.Connection) -> None:
    """Creates every table and view of the current schema version (idempotent)."""
    conn.executescript(DDL)
    # Files written before processes were followed, or before Python thread names: threads
    # gain their pid and comm columns.
    columns = {row[1] for row in conn.execute("PRAGMA table_info(threads)")}
    if "pid" not in columns:
        conn.execute("ALTER TABLE threads ADD COLUMN pid INTEGER")
    if "comm" not in columns:
        conn.execute("ALTER TABLE threads ADD COLUMN comm TEXT")
    create_views(conn)
    conn.execute(
        "INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', ?)",
        (str(SCHEMA_VERSION),),
    )
