"""`rsprof run`'s launcher (rsprof.session.launch and the stop path), on real processes:
the target gets the user's fds and environment unchanged, rsprof exits with the target's
status, and whatever ends rsprof (a signal, a full disk, kill -9) ends the target too."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from conftest import build_target, profile_meta, rsprof_env, wait_for_checkpoints

RSPROF = [sys.executable, "-P", "-m", "rsprof"]
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount a tmpfs")


def _gone(pid: int, timeout: float = 10) -> bool:
    """The process ended (gone, or a zombie nobody reaps: PID 1 here may not reap)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return True
        if stat.rsplit(")", 1)[1].split()[0] in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


def _kill_if_alive(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _run_both(command: list[str], tmp_path: Path, *rsprof_args: str,
              env: dict[bytes, bytes] | None = None,
              fds: str = "") -> tuple[subprocess.CompletedProcess[bytes],
                                      subprocess.CompletedProcess[bytes]]:
    """COMMAND run plainly and under `rsprof run`, with the same environment, and with the
    redirections `fds` (e.g. `3<a`) made by a shell that then execs either, as a user's
    shell does."""
    if env is None:
        env = {k.encode(): v.encode() for k, v in rsprof_env().items()}
    out = tmp_path / f"run{time.monotonic_ns()}.db"
    runs = []
    for argv in (command, [*RSPROF, "run", "-q", "-o", str(out), *rsprof_args, "--", *command]):
        if fds:
            argv = ["bash", "-c", f'exec {fds}; exec "$@"', "bash", *argv]
        runs.append(subprocess.run(argv, env=env, capture_output=True, timeout=120,
                                   stdin=subprocess.DEVNULL))
    assert b"Traceback" not in runs[1].stderr, runs[1].stderr
    return runs[0], runs[1]


# -- fds --------------------------------------------------------------------------------


@pytest.fixture
def user_fds(tmp_path: Path) -> str:
    """Two files a user hands over (`3<a 40<b`): a low fd and one above 9."""
    (tmp_path / "a").write_text("contents of a\n")
    (tmp_path / "b").write_text("contents of b\n")
    return f"3<{tmp_path}/a 40<{tmp_path}/b"


def test_inherited_fds_reach_the_target(user_fds: str, tmp_path: Path) -> None:
    """`rsprof run -- sh -c 'cat <&3' 3<file` printed 64 MiB of the heap ring (fd 3 was
    rsprof's own by then) instead of the file."""
    command = ["bash", "-c", "cat <&3; cat <&40"]
    for extra in ((), ("--no-heap",)):
        plain, ours = _run_both(command, tmp_path, *extra, fds=user_fds)
        assert plain.stdout == b"contents of a\ncontents of b\n"
        assert ours.stdout == plain.stdout, ours.stderr
        assert ours.returncode == 0, ours.stderr


_LIST_FDS = ("import os, re\n"
             "for fd in sorted(os.listdir('/proc/self/fd'), key=int):\n"
             "    try: link = os.readlink(f'/proc/self/fd/{fd}')\n"
             "    except OSError: continue\n"
             "    print(fd, re.sub(r'\\[\\d+\\]', '', link))\n")


def test_only_the_users_fds_reach_the_target(user_fds: str,
                                             tmp_path: Path) -> None:
    """The target has the fds the user gave rsprof, and none of rsprof's own (the release
    pipe, profile, perf events). With the heap shim, the target's own ring fd is the shim's."""
    command = [sys.executable, "-c", _LIST_FDS]
    for extra in ((), ("--no-heap",)):
        plain, ours = _run_both(command, tmp_path, *extra, fds=user_fds)
        theirs = [line for line in ours.stdout.decode().splitlines()
                  if "/dev/shm/rsprof-heap." not in line]
        assert theirs == plain.stdout.decode().splitlines(), ours.stderr


def test_make_jobserver_reaches_a_sub_make(tmp_path: Path) -> None:
    """`+rsprof run -- $(MAKE)` in a recipe: the sub-make finds the jobserver's fds."""
    (tmp_path / "inner.mk").write_text("all: a b\na b:\n\t@echo built $@\n")
    rsprof = " ".join(RSPROF)
    (tmp_path / "Makefile").write_text(
        f"all:\n\t+{rsprof} run -q --no-heap -o {tmp_path}/make.db -- $(MAKE) -f inner.mk\n")
    done = subprocess.run(["make", "-j4", "-s", "-C", str(tmp_path)], capture_output=True,
                          text=True, env=rsprof_env(), timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    assert "jobserver unavailable" not in done.stderr, done.stderr
    assert sorted(done.stdout.split("\n")[:2]) == ["built a", "built b"], done.stdout


# -- environment --------------------------------------------------------------------------


def _environment(output: bytes) -> Counter[bytes]:
    return Counter(entry for entry in output.split(b"\0") if entry)


@pytest.mark.parametrize("heap", [True, False], ids=["heap", "no-heap"])
def test_environment_is_the_users_byte_for_byte(tmp_path: Path, heap: bool) -> None:
    """The launcher added LC_CTYPE=C.UTF-8 (Python's locale coercion of rsprof's own
    interpreter) under LANG=C, dropped OLDPWD and `_`, and reformatted exported bash
    functions (a bash wrapper re-exported them)."""
    env = {k.encode(): v.encode() for k, v in rsprof_env().items()
           if not k.startswith(("LC_", "LANG", "RSPROF_HEAP", "LD_PRELOAD"))}
    env |= {
        b"LANG": b"C",
        b"OLDPWD": str(tmp_path).encode(),
        b"_": b"/usr/bin/env",
        b"BASH_FUNC_greet%%": b"() { echo  hi;  }",  # not in bash's own layout
        b"RSPROF_T_BYTES": b"\xff\xfe not utf-8",
        b"RSPROF_T_EMPTY": b"",
    }
    extra = () if heap else ("--no-heap",)
    plain, ours = _run_both(["env", "-0"], tmp_path, *extra, env=env)
    assert ours.returncode == 0, ours.stderr
    before, after = _environment(plain.stdout), _environment(ours.stdout)
    assert before[b"LANG=C"] == 1 and before[b"BASH_FUNC_greet%%=() { echo  hi;  }"] == 1
    missing = before - after
    added = after - before
    assert not missing, (missing, ours.stderr)
    if heap:  # the shim and its settings, nothing else
        assert {entry.split(b"=", 1)[0] for entry in added} <= {
            b"LD_PRELOAD", b"RSPROF_HEAP_EXIT_WAIT_MS", b"RSPROF_HEAP_WAIT_PPID",
            b"RSPROF_HEAP_RING_MB"}, added
        assert any(entry.startswith(b"LD_PRELOAD=") for entry in added)
    else:
        assert not added, added


def test_locale_of_the_target_is_the_users(tmp_path: Path) -> None:
    """`wc -m` counts bytes under LANG=C: 6 for "café\\n" plainly, and under rsprof too."""
    env = {k.encode(): v.encode() for k, v in rsprof_env().items()
           if not k.startswith(("LC_", "LANG"))}
    env[b"LANG"] = b"C"
    command = ["sh", "-c", "printf 'caf\\303\\251\\n' | wc -m"]
    plain, ours = _run_both(command, tmp_path, "--no-heap", env=env)
    assert plain.stdout.strip() == b"6"
    assert ours.stdout.strip() == b"6", ours.stderr


# -- exit status --------------------------------------------------------------------------


@pytest.mark.parametrize(("script", "status"), [
    ("exit 1", 1), ("exit 5", 5), ("exit 7", 7),
    ("ulimit -c 0; kill -ABRT $$", 128 + signal.SIGABRT),
    ("ulimit -c 0; kill -SEGV $$", 128 + signal.SIGSEGV),
    ("kill -PIPE $$", 128 + signal.SIGPIPE),
])
def test_exit_status_is_the_targets(tmp_path: Path, script: str, status: int) -> None:
    """`rsprof run -- ./tests && deploy` must not deploy after failing tests: the status of
    a target that ended on its own is rsprof's (128 + signal for a signal, as shells do)."""
    plain, ours = _run_both(["sh", "-c", script], tmp_path, "--no-heap")
    assert plain.returncode in (status, status - 256, -(status - 128))
    assert ours.returncode == status, ours.stderr
    assert "stopped: target-exited" in ours.stderr.decode()


def test_exit_status_with_the_heap_shim(tmp_path: Path) -> None:
    _, ours = _run_both(["sh", "-c", "exit 5"], tmp_path)
    assert ours.returncode == 5, ours.stderr
    assert "target exited with code 5" in ours.stderr.decode()


def _start_run(out: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*RSPROF, "run", "-q", "--no-heap", "-i", "200ms", "-o", str(out), *args],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        env=rsprof_env())


@pytest.mark.parametrize(("sig", "status", "reason"), [
    (signal.SIGINT, 130, "interrupted"),
    (signal.SIGTERM, 128 + signal.SIGTERM, "terminated"),
])
def test_signal_stops_the_target_and_sets_the_status(tmp_path: Path, sig: int, status: int,
                                                     reason: str) -> None:
    out = tmp_path / "sig.db"
    recorder = _start_run(out, "--", str(build_target("split.c")), "60", "100000")
    target = 0
    try:
        wait_for_checkpoints(out, 2)
        target = int(profile_meta(out)["pid"])
        recorder.send_signal(sig)
        _, stderr = recorder.communicate(timeout=30)
    finally:
        if recorder.poll() is None:
            recorder.kill()
        if target:
            _kill_if_alive(target)
    assert recorder.returncode == status, stderr
    assert f"stopped: {reason}" in stderr
    assert _gone(target)


def test_duration_on_a_target_ignoring_sigterm(tmp_path: Path) -> None:
    """-d reached: SIGTERM, then SIGKILL after the grace, said on stderr; status 0."""
    out = tmp_path / "deaf.db"
    started = time.monotonic()
    recorder = _start_run(out, "-d", "1s", "--", "sh", "-c",
                          "trap '' TERM; while :; do sleep 0.1; done")
    _, stderr = recorder.communicate(timeout=60)
    assert recorder.returncode == 0, stderr
    assert "did not exit 5 s after SIGTERM: sent SIGKILL" in stderr, stderr
    assert time.monotonic() - started < 40
    assert _gone(int(profile_meta(out)["pid"]))


# -- rsprof ending without a word ---------------------------------------------------------


def test_kill_9_of_rsprof_ends_the_target(tmp_path: Path) -> None:
    out = tmp_path / "killed.db"
    recorder = _start_run(out, "--", str(build_target("split.c")), "60", "100000")
    target = 0
    try:
        wait_for_checkpoints(out, 2)
        target = int(profile_meta(out)["pid"])
        recorder.send_signal(signal.SIGKILL)
        recorder.wait(timeout=10)
        assert _gone(target), f"target {target} outlived rsprof"
    finally:
        if recorder.poll() is None:
            recorder.kill()
            recorder.wait()
        if target:
            _kill_if_alive(target)


@needs_root
def test_disk_full_ends_the_target(tmp_path: Path) -> None:
    mount = tmp_path / "tiny"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)],
                          capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr!r}")
    target = 0
    try:
        out = mount / "full.db"
        recorder = _start_run(out, "--", str(build_target("split.c")), "60", "100000")
        wait_for_checkpoints(out, 3)
        target = int(profile_meta(out)["pid"])
        filler = os.open(mount / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while os.write(filler, b"\0" * 4096) > 0:
                pass
        except OSError:
            pass  # ENOSPC: the disk is full
        finally:
            os.close(filler)
        recorder.wait(timeout=30)
        # Before reading stderr: a target left running holds the pipe open.
        assert _gone(target, timeout=2), f"target {target} outlived rsprof"
        _, stderr = recorder.communicate(timeout=30)
        assert recorder.returncode == 6, stderr
        assert "disk is full" in stderr
    finally:
        if target:
            _kill_if_alive(target)
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_an_internal_error_stops_the_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """A bug that raises in the middle of a recording: one line, exit 1, the target stopped.
    In-process (the CLI's own entry point), to plant the bug."""
    from rsprof.collector.recorder import Recorder

    from rsprof.cli import main

    seen: list[int] = []
    checkpoint = Recorder._checkpoint

    def failing(self: Recorder, final: bool = False) -> bool:
        seen.append(self.target.pid)
        if len(seen) >= 2:
            raise RuntimeError("planted")
        return checkpoint(self, final)

    monkeypatch.setattr(Recorder, "_checkpoint", failing)
    monkeypatch.delenv("RSPROF_DEBUG", raising=False)
    code = main(["run", "-q", "--no-heap", "-i", "100ms", "-o", str(tmp_path / "bug.db"), "--",
                 str(build_target("split.c")), "60", "100000"])
    err = capsys.readouterr().err
    assert code == 1, err
    assert "internal error: RuntimeError: planted" in err
    assert seen and _gone(seen[0], timeout=2), f"target {seen[0]} outlived the error"
