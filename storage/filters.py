"""pprof's sample filters, with pprof's meanings (`go tool pprof -focus/-ignore/-show/-hide`).

A regex matches a frame when it matches (anywhere, as Go's MatchString does) one of the
frame's function names or source files, inlined ones included, or the module's path.

- focus: keep only samples with at least one matching frame;
- ignore: drop samples with a matching frame (ignore wins over focus);
- hide: remove matching functions from stacks (a sample left with no frame is dropped);
- show: keep only matching functions in stacks (likewise).

Percentages stay relative to the unfiltered total, as in pprof (its default without
`-relative_percentages`), so a focused report says how much of the program it covers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from rsprof.storage.runtime import fold_runtime
from rsprof.storage.samples import Frame, Line, Sample


@dataclass(frozen=True, slots=True)
class FrameFilter:
    focus: re.Pattern[str] | None = None
    ignore: re.Pattern[str] | None = None
    show: re.Pattern[str] | None = None
    hide: re.Pattern[str] | None = None
    # --hide-runtime: start-up and interpreter frames folded out (storage/runtime.py), after
    # the regexes; never drops a sample.
    hide_runtime: bool = False

    @classmethod
    def compile(cls, *, focus: str | None = None, ignore: str | None = None,
                show: str | None = None, hide: str | None = None,
                hide_runtime: bool = False) -> FrameFilter:
        """Raises ValueError naming the option whose regex does not compile."""
        patterns: dict[str, re.Pattern[str] | None] = {}
        for option, text in (("focus", focus), ("ignore", ignore), ("show", show),
                             ("hide", hide)):
            try:
                patterns[option] = re.compile(text) if text else None
            except re.error as error:
                raise ValueError(f"--{option} {text!r} is not a valid regex: {error}") from None
        return cls(**patterns, hide_runtime=hide_runtime)

    @property
    def active(self) -> bool:
        return self.hide_runtime or any(
            p is not None for p in (self.focus, self.ignore, self.show, self.hide))

    def describe(self) -> str:
        """'focus=heavy; hide=spin', as pprof's "Active filters" line."""
        parts = [f"{name}={pattern.pattern}" for name, pattern in (
            ("focus", self.focus), ("ignore", self.ignore), ("show", self.show),
            ("hide", self.hide)) if pattern is not None]
        return "; ".join([*parts, "hide-runtime"] if self.hide_runtime else parts)

    def apply(self, samples: list[Sample]) -> list[Sample]:
        if not self.active:
            return samples
        # Keyed by id(): frames are shared objects of one SampleSet (alive for this call), and
        # hashing a frame's whole value per sample would dominate the filter's cost.
        verdicts: dict[int, bool | None] = {}  # True focused, False ignored, None neither
        rewritten: dict[int, Frame | None] = {}  # after show/hide; None = hidden
        kept: list[Sample] = []
        for sample in samples:
            frames = self.stack(sample.frames, verdicts, rewritten)
            if frames is None:
                continue
            kept.append(replace(sample, frames=frames) if frames is not sample.frames
                         else sample)
        return kept

    def stack(
        self,
        frames: tuple[Frame, ...],
        verdicts: dict[int, bool | None] | None = None,
        rewritten: dict[int, Frame | None] | None = None,
    ) -> tuple[Frame, ...] | None:
        """One stack after the filters (the same object when they change nothing), or None
        when its sample is dropped. `verdicts` and `rewritten` cache per frame object across
        calls; the TUI's followed file filters its stacks one by one through here."""
        if not self._selected(frames, {} if verdicts is None else verdicts):
            return None
        if self.show is not None or self.hide is not None:
            visible = self._visible(frames, {} if rewritten is None else rewritten)
            if not visible:
                return None
            if visible != frames:  # else the same object: the stack is unchanged
                frames = visible
        if self.hide_runtime:
            folded = fold_runtime(frames)
            if len(folded) != len(frames):
                frames = folded
        return frames

    def _selected(self, frames: tuple[Frame, ...], verdicts: dict[int, bool | None]) -> bool:
        if self.focus is None and self.ignore is None:
            return True
        focused = False
        for frame in frames:
            key = id(frame)
            if key not in verdicts:
                verdict: bool | None = None
                if self.ignore is not None and _frame_matches(frame, self.ignore):
                    verdict = False
                elif self.focus is None or _frame_matches(frame, self.focus):
                    verdict = True
                verdicts[key] = verdict
            verdict = verdicts[key]
            if verdict is False:
                return False
            focused = focused or verdict is True
        return focused

    def _visible(
        self, frames: tuple[Frame, ...], rewritten: dict[int, Frame | None]
    ) -> tuple[Frame, ...]:
        visible: list[Frame] = []
        for frame in frames:
            key = id(frame)
            if key not in rewritten:
                rewritten[key] = self._rewrite(frame)
            new = rewritten[key]
            if new is not None:
                visible.append(new)
        return tuple(visible)

    def _rewrite(self, frame: Frame) -> Frame | None:
        lines = frame.lines
        if self.hide is not None:
            lines = () if _module_matches(frame, self.hide) else tuple(
                line for line in lines if not _line_matches(line, self.hide))
        if self.show is not None and not _module_matches(frame, self.show):
            lines = tuple(line for line in lines if _line_matches(line, self.show))
        if not lines:
            return None
        return frame if lines == frame.lines else replace(frame, lines=lines)


def _line_matches(line: Line, pattern: re.Pattern[str]) -> bool:
    return bool(pattern.search(line.function) or (line.file and pattern.search(line.file)))


def _module_matches(frame: Frame, pattern: re.Pattern[str]) -> bool:
    return bool(frame.module and pattern.search(frame.module))


def _frame_matches(frame: Frame, pattern: re.Pattern[str]) -> bool:
    return _module_matches(frame, pattern) or any(_line_matches(line, pattern)
                                                   for line in frame.lines)
