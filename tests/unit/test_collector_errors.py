"""rsprof.collector.errors: the kinds of failure the CLI maps to exit codes."""

from __future__ import annotations

import pytest
from rsprof.collector.errors import (
    PERMISSION_HINT,
    CollectorError,
    NotProfilable,
    PermissionDenied,
    ProcessNotFound,
)


@pytest.mark.parametrize("kind", [ProcessNotFound, NotProfilable, PermissionDenied])
def test_every_kind_is_a_collector_error_with_its_message(kind: type[CollectorError]) -> None:
    with pytest.raises(CollectorError, match=r"^one line$"):
        raise kind("one line")
    assert not issubclass(kind, OSError)  # never caught as an OS error by mistake


def test_kinds_are_distinct() -> None:
    kinds = [ProcessNotFound, NotProfilable, PermissionDenied]
    for kind in kinds:
        assert [k for k in kinds if issubclass(kind, k)] == [kind]


def test_permission_hint_names_every_way_out() -> None:
    for way in ("root", "CAP_PERFMON", "perf_event_paranoid"):
        assert way in PERMISSION_HINT
    assert "\n" not in PERMISSION_HINT
