"""Creating the profile file (storage/writer.py): never through a symbolic link, never on
top of another file, side files (-wal, -shm, -journal) checked; and `rsprof query` leaves
a WAL-mode profile byte for byte and time for time as it was (storage/reader.py).

Every link points into the test's own temporary folder, never at a system path."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import rsprof_env, run_rsprof
from rsprof.storage.errors import ProfileError, ProfileExists
from rsprof.storage.writer import Checkpoint, ProfileWriter


def _record(out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """A short real recording of a sleeping process into `out`."""
    return run_rsprof("run", "-q", "-d", "200ms", "-o", str(out), *extra, "--", "sleep", "5")


def _one_line(result: subprocess.CompletedProcess[str], code: int) -> str:
    assert result.returncode == code, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def test_dangling_output_link_creates_nothing_at_its_target(tmp_path: Path) -> None:
    """`-o link` where link points at a missing file: SQLite used to create the target (an
    empty root-owned file wherever the link pointed). Now exit 6, one line, no target."""
    target = tmp_path / "victim"
    link = tmp_path / "out.db"
    link.symlink_to(target)
    line = _one_line(_record(link), 6)
    assert "symbolic link" in line
    assert not target.exists()
    assert link.is_symlink()


def test_output_link_to_a_file_leaves_it_unchanged(tmp_path: Path) -> None:
    target = tmp_path / "victim"
    target.write_bytes(b"")  # empty: SQLite would make a database of it
    before = (target.stat().st_mtime_ns, target.read_bytes())
    link = tmp_path / "out.db"
    link.symlink_to(target)
    for extra in ((), ("-a",)):
        assert "symbolic link" in _one_line(_record(link, *extra), 6)
        assert (target.stat().st_mtime_ns, target.read_bytes()) == before


@pytest.mark.parametrize("suffix", ["-wal", "-shm", "-journal"])
def test_planted_side_file_link_is_refused(tmp_path: Path, suffix: str) -> None:
    """A link at `out.db-shm` (or -wal, -journal): one line naming it, exit 6, nothing
    created at its target and no profile left behind."""
    target = tmp_path / "victim"
    out = tmp_path / "out.db"
    Path(f"{out}{suffix}").symlink_to(target)
    line = _one_line(_record(out), 6)
    assert f"out.db{suffix} is a symbolic link" in line
    assert not target.exists()
    assert not out.exists()


def test_stale_side_file_refused_beside_a_new_profile(tmp_path: Path) -> None:
    """A -wal left from an earlier file of that name would be replayed into the new one."""
    out = tmp_path / "out.db"
    Path(f"{out}-wal").write_bytes(b"stale")
    assert "already exists" in _one_line(_record(out), 6)
    assert Path(f"{out}-wal").read_bytes() == b"stale"
    assert not out.exists()


def test_created_with_0644_minus_umask(tmp_path: Path) -> None:
    out = tmp_path / "out.db"
    code = (
        "import os, sys; os.umask(0o027);"
        "from rsprof.storage.writer import ProfileWriter;"
        "ProfileWriter(sys.argv[1]).finish('duration')"
    )
    subprocess.run([sys.executable, "-P", "-c", code, str(out)], check=True, env=rsprof_env())
    assert stat.S_IMODE(out.stat().st_mode) == 0o640
    assert out.stat().st_uid == os.geteuid()


def test_racing_link_never_creates_its_target(tmp_path: Path) -> None:
    """An attacker plants and removes a dangling link under the output name in a loop
    while profiles are created there: the link's target is never created (before:
    SQLite's open followed a link planted after rsprof's existence check)."""
    target = tmp_path / "victim"
    stop = threading.Event()

    def attacker(name: Path) -> None:
        while not stop.is_set():
            try:
                name.symlink_to(target)
            except OSError:
                pass
            try:
                if name.is_symlink():
                    name.unlink()
            except OSError:
                pass

    refused = created = 0
    for attempt in range(60):
        name = tmp_path / f"p{attempt}.db"
        thread = threading.Thread(target=attacker, args=(name,))
        thread.start()
        try:
            ProfileWriter(name).close()
            created += 1
        except ProfileError:
            refused += 1
        finally:
            stop.set()
            thread.join()
            stop.clear()
        assert not target.exists(), f"attempt {attempt}: the link's target was created"
    assert refused + created == 60


def test_file_swapped_before_sqlite_opens_it_is_refused(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """In a folder others can write to, the new file can be renamed away and a link to
    another file put in its place before SQLite opens the name: the descriptor SQLite
    got is checked to be the file rsprof created and locked, before any write."""
    other = tmp_path / "other"
    other.write_bytes(b"")
    out = tmp_path / "out.db"
    original = ProfileWriter._check_side_files

    def swap(self: ProfileWriter) -> None:
        original(self)
        os.rename(out, tmp_path / "moved.db")
        out.symlink_to(other)

    monkeypatch.setattr(ProfileWriter, "_check_side_files", swap)
    with pytest.raises(ProfileError, match="replaced"):
        ProfileWriter(out)
    assert other.read_bytes() == b""


def test_existing_profile_not_overwritten(tmp_path: Path) -> None:
    out = tmp_path / "out.db"
    out.write_bytes(b"mine")
    with pytest.raises(ProfileExists):
        ProfileWriter(out)
    assert out.read_bytes() == b"mine"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount a tmpfs")
def test_read_only_folder_exits_6(tmp_path: Path) -> None:
    """A read-only file system under -o: exit 6 (database), as README says; was 1."""
    mount = tmp_path / "ro"
    mount.mkdir()
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no unshare")
    script = (
        f"mount -t tmpfs -o ro tmpfs {mount} && exec {sys.executable} -P -m rsprof run -q"
        f" -d 200ms -o {mount}/x.db -- sleep 5"
    )
    result = subprocess.run([unshare, "-m", "sh", "-c", script], capture_output=True,
                            text=True, timeout=60, env=rsprof_env())
    if "mount:" in result.stderr:
        pytest.skip(f"cannot mount here: {result.stderr.strip()}")
    assert "Read-only file system" in _one_line(result, 6)


# ------------------------------------------------------------------ query leaves WAL files


def _snapshot(folder: Path) -> dict[str, tuple[int, str]]:
    return {
        p.name: (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
        for p in sorted(folder.iterdir())
    }


def _killed_recording(folder: Path) -> Path:
    """A profile whose recorder died (os._exit, as kill -9): WAL mode, -wal and -shm."""
    out = folder / "killed.db"
    code = (
        "import os, sys\n"
        "from rsprof.storage.writer import Checkpoint, ProfileWriter\n"
        "w = ProfileWriter(sys.argv[1])\n"
        "w.set_meta({'pid': 1, 'process_name': 'k', 'state': 'recording'})\n"
        "for i in range(3):\n"
        "    w.write_checkpoint(Checkpoint(timestamp_ms=1000 * (i + 1)))\n"
        "os._exit(9)\n"
    )
    subprocess.run([sys.executable, "-P", "-c", code, str(out)], check=False, env=rsprof_env())
    assert Path(f"{out}-wal").exists() and Path(f"{out}-shm").exists()
    return out


def test_query_on_wal_profile_modifies_nothing(tmp_path: Path) -> None:
    """`rsprof query` (and every report, through the same opener) on a WAL-mode profile:
    the rows of the WAL are read, and no file beside it changes, mtime or bytes (before:
    the -shm index was rewritten)."""
    out = _killed_recording(tmp_path)
    before = _snapshot(tmp_path)
    os.utime(f"{out}-shm", ns=(1, 1))  # an old mtime: a rewrite cannot hide in the same tick
    before = _snapshot(tmp_path)
    result = run_rsprof("query", str(out), "SELECT count(*) FROM checkpoints")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["count(*)", "3"]
    assert _snapshot(tmp_path) == before


def test_query_on_wal_profile_without_index(tmp_path: Path) -> None:
    """The -shm deleted and the WAL empty: opened immutable (nothing to miss), no file made."""
    out = tmp_path / "p.db"
    writer = ProfileWriter(out)
    writer.set_meta({"pid": 1, "process_name": "p", "state": "recording"})
    writer.write_checkpoint(Checkpoint(timestamp_ms=1000))
    writer.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    writer.conn.close()
    writer._unlock()
    Path(f"{out}-shm").unlink(missing_ok=True)
    Path(f"{out}-wal").unlink(missing_ok=True)
    before = _snapshot(tmp_path)
    result = run_rsprof("query", str(out), "SELECT count(*) FROM checkpoints")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["count(*)", "1"]
    assert _snapshot(tmp_path) == before


def test_query_follows_a_live_recording(tmp_path: Path) -> None:
    """A recorder still writing: queries see its checkpoints as they commit."""
    out = tmp_path / "live.db"
    writer = ProfileWriter(out)
    writer.set_meta({"pid": 1, "process_name": "p", "state": "recording"})
    counts = []
    for i in range(3):
        writer.write_checkpoint(Checkpoint(timestamp_ms=1000 * (i + 1)))
        result = run_rsprof("query", str(out), "SELECT count(*) FROM checkpoints")
        assert result.returncode == 0, result.stderr
        counts.append(int(result.stdout.split()[1]))
    writer.finish("duration")
    assert counts == [1, 2, 3]


def test_append_to_a_fifo_is_refused_without_hanging(tmp_path: Path) -> None:
    fifo = tmp_path / "out.db"
    os.mkfifo(fifo)
    with pytest.raises(ProfileError, match="not a regular file"):
        ProfileWriter(fifo, append=True)
