"""rsprof.tui.widgets.footer: FitFooter shows as many keys as fit on one line, leaving out
the lowest-ranked (then rightmost) ones, never cutting one; without a ranking, Textual's
footer as is. A tiny app in Textual's test harness (no terminal, no process)."""

from __future__ import annotations

import asyncio
from typing import ClassVar

import pytest
from rsprof.tui.widgets.footer import FitFooter
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets._footer import FooterKey

# "a Alpha one " is 1 + 9 + 3 = 13 cells, "b Bravo two " 13, "c Charlie three " 17: 43
BINDINGS = [Binding("a", "one", "Alpha one"), Binding("b", "two", "Bravo two"),
            Binding("c", "three", "Charlie three"), Binding("d", "four", "Hidden", show=False)]


class Ranked(Screen[None]):
    BINDINGS = BINDINGS  # type: ignore[assignment]
    RANKS: ClassVar[dict[str, int]] = {"one": 3, "two": 1, "three": 2, "four": 9}

    def compose(self) -> ComposeResult:
        yield FitFooter()

    def footer_priority(self, action: str) -> int:
        return self.RANKS[action]

    def action_one(self) -> None: ...
    def action_two(self) -> None: ...
    def action_three(self) -> None: ...
    def action_four(self) -> None: ...


class Tied(Ranked):
    RANKS: ClassVar[dict[str, int]] = {"one": 1, "two": 1, "three": 1, "four": 1}


class Unranked(Screen[None]):
    BINDINGS = BINDINGS  # type: ignore[assignment]

    def compose(self) -> ComposeResult:
        yield FitFooter()

    def action_one(self) -> None: ...
    def action_two(self) -> None: ...
    def action_three(self) -> None: ...
    def action_four(self) -> None: ...


def shown_keys(screen: type[Screen[None]], width: int) -> list[str]:
    class Tiny(App[None]):
        def on_mount(self) -> None:
            self.push_screen(screen())

    async def run() -> list[str]:
        app = Tiny()
        async with app.run_test(size=(width, 4)) as pilot:
            for _ in range(20):
                await pilot.pause()
                keys = [key.key for key in app.screen.query(FooterKey)]
                if keys:
                    return keys
            return []

    return asyncio.run(run())


@pytest.mark.parametrize(("screen", "width", "keys"), [
    pytest.param(Ranked, 80, ["a", "b", "c"], id="all-fit"),
    pytest.param(Ranked, 42, ["a", "b", "c"], id="the-last-pad-may-fall-off"),
    pytest.param(Ranked, 41, ["a", "c"], id="lowest-rank-goes-first"),
    pytest.param(Ranked, 20, ["a"], id="then-the-next"),
    pytest.param(Tied, 41, ["a", "b"], id="ties-the-rightmost"),
    pytest.param(Unranked, 20, ["a", "b", "c"], id="no-ranking-no-dropping"),
])
def test_keys_that_fit(screen: type[Screen[None]], width: int, keys: list[str]) -> None:
    assert shown_keys(screen, width) == keys


class Switching(Ranked):
    """`three` is shown only while `mode` is on, as rsprof's keys depend on the open view."""

    mode = False

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return self.mode or action != "three"


def test_a_bindings_refresh_that_shows_the_same_keys_keeps_the_footer() -> None:
    """Textual recomposes its footer on every bindings refresh; FitFooter only when the shown
    keys change (each recompose mounts and styles every key: most of a view key's time)."""

    class Tiny(App[None]):
        def on_mount(self) -> None:
            self.push_screen(Switching())

    async def run() -> tuple[list[str], list[str], list[str], bool, bool]:
        app = Tiny()
        async with app.run_test(size=(80, 4)) as pilot:
            screen = app.screen
            assert isinstance(screen, Switching)
            for _ in range(20):
                await pilot.pause()
                if list(screen.query(FooterKey)):
                    break
            before = list(screen.query(FooterKey))
            for _ in range(3):  # nothing the footer shows changed
                screen.refresh_bindings()
                await pilot.pause()
            same = list(screen.query(FooterKey))
            screen.mode = True
            screen.refresh_bindings()
            for _ in range(20):
                await pilot.pause()
                if len(list(screen.query(FooterKey))) == 3:
                    break
            after = list(screen.query(FooterKey))
            kept = all(a is b for a, b in zip(before, same, strict=True))
            # the keys that stay keep their widgets when others come or go
            kept = kept and all(a is b for a, b in zip(before, after, strict=False))
            compact = any(key.has_class("-compact") for key in after)
            return ([k.key for k in before], [k.key for k in same], [k.key for k in after],
                    kept, compact)

    before, same, after, kept, compact = asyncio.run(run())
    assert before == same == ["a", "b"]
    assert kept  # the same widgets: no recompose, not even when a key is added
    assert after == ["a", "b", "c"]  # a key that appears is shown
    assert not compact  # the wide style, as Textual's footer draws it by default


class MiddleGoes(Ranked):
    """`two` leaves when `mode` is on: the widget that showed it shows `three`."""

    mode = False

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return not (self.mode and action == "two")


def test_a_key_that_leaves_hands_its_widget_to_the_next() -> None:
    class Tiny(App[None]):
        def on_mount(self) -> None:
            self.push_screen(MiddleGoes())

    async def run() -> tuple[list[str], list[FooterKey], list[FooterKey], str]:
        app = Tiny()
        async with app.run_test(size=(80, 4)) as pilot:
            screen = app.screen
            assert isinstance(screen, MiddleGoes)
            for _ in range(20):
                await pilot.pause()
                if len(list(screen.query(FooterKey))) == 3:
                    break
            before = list(screen.query(FooterKey))
            keys = [k.key for k in before]
            screen.mode = True
            screen.refresh_bindings()
            for _ in range(20):
                await pilot.pause()
                if len(list(screen.query(FooterKey))) == 2:
                    break
            after = list(screen.query(FooterKey))
            return keys, before, after, str(after[1].render())

    keys, before, after, drawn = asyncio.run(run())
    assert keys == ["a", "b", "c"]
    assert [k.key for k in after] == ["a", "c"]
    assert after[0] is before[0] and after[1] is before[1]  # reused, not mounted again
    assert drawn == " c Charlie three "  # and it draws its new key
