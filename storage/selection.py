"""What a report or export reads: the samples of one kind, narrowed by time range and thread,
then by pprof's filters. Every analysis command and every export goes through `select`."""

from __future__ import annotations

from dataclasses import dataclass, field

from rsprof.storage.errors import ProfileError
from rsprof.storage.filters import FrameFilter
from rsprof.storage.reader import Profile
from rsprof.storage.samples import SampleSet, TimeRange, load_samples


class EmptySelection(ProfileError):
    """Nothing to report: the profile has no samples of that kind, or the filters kept none."""


@dataclass(frozen=True, slots=True)
class SampleQuery:
    kind: str = "cpu"
    tid: int | None = None
    time_range: TimeRange = field(default_factory=TimeRange)
    filters: FrameFilter = field(default_factory=FrameFilter)
    pid: int | None = None  # one process of a recording that followed children


WHOLE_CPU_PROFILE = SampleQuery()


@dataclass(slots=True)
class Selection:
    samples: SampleSet  # after every filter
    unfiltered_total: list[int]  # per sample type, after range and thread but before filters

    def percent(self, value: int, index: int) -> float:
        whole = self.unfiltered_total[index]
        return round(100.0 * value / whole, 2) if whole else 0.0


def select(profile: Profile, query: SampleQuery) -> Selection:
    samples = load_samples(profile, query.kind, time_range=query.time_range, tid=query.tid,
                           pid=query.pid)
    totals = [samples.total(i) for i in range(len(samples.sample_types))]
    samples.samples = query.filters.apply(samples.samples)
    return Selection(samples, totals)


def require_samples(selection: Selection, query: SampleQuery, path: object) -> None:
    """Exports refuse to write an empty profile; the message says why it is empty."""
    if selection.samples.samples:
        return
    if not any(selection.unfiltered_total):
        what = "CPU samples" if query.kind == "cpu" else "heap data"
        narrowed = (query.tid is not None or query.pid is not None
                    or query.time_range != TimeRange())
        where = " in the selected time range / thread / process" if narrowed else ""
        hint = "" if query.kind == "cpu" or narrowed else (
            " (record with `rsprof run -- CMD` to track the heap)")
        raise EmptySelection(f"{path}: no {what}{where}{hint}")
    raise EmptySelection(f"{path}: the filters ({query.filters.describe()}) kept no samples")
