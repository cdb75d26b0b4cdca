"""The target process seen from outside (psutil): CPU %, RSS, and whether it still runs."""

from __future__ import annotations

import psutil

from .model import TargetStatus


class TargetMonitor:
    """Polled from a worker thread once per refresh; keeps the last numbers once it exits."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._status = TargetStatus()
        self._proc: psutil.Process | None
        try:
            self._proc = psutil.Process(pid)
            self._proc.cpu_percent(None)
        except psutil.Error:
            self._proc = None
            self._status = TargetStatus(alive=False)

    def poll(self) -> TargetStatus:
        proc = self._proc
        if proc is None:
            return self._status
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                raise psutil.NoSuchProcess(self.pid)
            with proc.oneshot():
                self._status = TargetStatus(proc.cpu_percent(None), proc.memory_info().rss, True)
        except psutil.Error:
            self._proc = None
            s = self._status
            self._status = TargetStatus(s.cpu_pct, s.rss_bytes, alive=False)
        return self._status
