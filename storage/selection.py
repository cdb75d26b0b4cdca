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
    # CPU samples of each checkpoint kept apart, with its interval (timelines: Firefox)
    per_checkpoint: bool = False


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
                           pid=query.pid, per_checkpoint=query.per_checkpoint)
    totals = [samples.total(i) for i in range(len(samples.sample_types))]
    samples.samples = query.filters.apply(samples.samples)
    return Selection(samples, totals)


def empty_reason(selection: Selection, query: SampleQuery, duration_ms: int | None = None) -> str:
    """Why `selection` holds no samples, as one line ("" when it holds some): what was
    asked for and, for a time range, how long the recording lasts."""
    if selection.samples.samples:
        return ""
    if any(selection.unfiltered_total):
        return f"the filters ({query.filters.describe()}) kept no samples"
    what = {"cpu": "CPU samples", "offcpu": "off-CPU time", "wall": "wall-clock time"}.get(
        query.kind, "heap data")
    narrowed = []
    if query.time_range != TimeRange():
        lasts = f"; the recording lasts {duration_ms / 1000:.1f} s" if duration_ms else ""
        narrowed.append(f"in the time range {query.time_range.describe()}{lasts}")
    if query.tid is not None:
        narrowed.append(f"of thread {query.tid}")
    if query.pid is not None:
        narrowed.append(f"of process {query.pid}")
    if narrowed:
        return f"no {what} " + ", ".join(narrowed)
    if query.kind == "heap":
        return f"no {what} (record with `rsprof run -- CMD` to track the heap)"
    if query.kind == "offcpu":
        return (f"no {what} (recorded with --off-cpu where permitted: meta offcpu_error"
                " says why not)")
    return f"no {what}"


def require_samples(selection: Selection, query: SampleQuery, path: object,
                    duration_ms: int | None = None) -> None:
    """Exports refuse to write an empty profile; the message says why it is empty."""
    reason = empty_reason(selection, query, duration_ms)
    if reason:
        raise EmptySelection(f"{path}: {reason}")
