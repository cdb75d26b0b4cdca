"""The footer: the keys that matter in the current mode, as many as fit on one line."""

from __future__ import annotations

from collections.abc import Callable

from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Footer
from textual.widgets._footer import FooterKey


class WideFooterKey(FooterKey):
    """Textual's footer key in its wide style only. Textual's starts compact and is bound to
    the footer's `compact`: each key mounted restyled itself twice (class added, then
    removed), most of a footer recompose's time. This footer is never compact."""

    compact = reactive(False, init=False)

    def _watch_compact(self, compact: bool) -> None:
        pass

    def show_key(self, key: str, key_display: str, description: str, action: str,
                 disabled: bool, tooltip: str) -> None:
        """Shows another key in this widget (cheaper than a new widget: no mount, no
        styling beyond the `-disabled` class)."""
        changed = (key_display, description) != (self.key_display, self.description)
        self.key, self.key_display, self.description, self.action = (
            key, key_display, description, action)
        self._disabled = disabled
        self.set_class(disabled, "-disabled")
        self.tooltip = tooltip or None
        self.refresh(layout=changed)


class FitFooter(Footer):
    """Textual's footer, but a key that does not fit is left out instead of cut: the
    screen's `footer_priority(action)` ranks the keys shown in its mode (higher stays),
    and the lowest-ranked, rightmost ones go first until the rest fit the width. `?` lists
    every key anyway."""

    # One shown key: (binding, enabled, tooltip).
    _shown_keys: list[tuple[Binding, bool, str]] | None = None

    def compose(self) -> ComposeResult:
        if not self._bindings_ready:
            return
        shown = self._fitting_keys()
        self._shown_keys = shown
        self.styles.grid_size_columns = len(shown)
        self._width = self.app.size.width
        for binding, enabled, tooltip in shown:
            yield WideFooterKey(
                binding.key,
                self.app.get_key_display(binding),
                binding.description,
                binding.action,
                disabled=not enabled,
                tooltip=tooltip,
            )

    def bindings_changed(self, screen: Screen) -> None:
        # Textual recomposes the footer on every bindings refresh (each view key, each focus
        # change): ~20 FooterKey widgets mounted and styled, a third of the UI thread's time
        # while keys are pressed (py-spy, bench_tui_keys --views). Most refreshes leave the
        # shown keys as they were: those keep the widgets.
        self._bindings_ready = True
        if not screen.app.app_focus or not (self.is_attached and screen is self.screen):
            return
        if self._shown_keys is None:
            self.call_after_refresh(self.recompose)
        elif not self._same(self._fitting_keys(), self._shown_keys):
            self.call_after_refresh(self._update_keys)

    def _update_keys(self) -> None:
        """The keys to show changed (a view opened or closed): the key widgets there are
        take the new keys in order, and only the keys beyond them are new widgets. A
        recompose mounted and styled every key again: 10 % of the UI thread's time while
        `c` opened and closed the chart (py-spy)."""
        if not self.is_attached:
            return
        shown = self._fitting_keys()
        if self._shown_keys is not None and self._same(shown, self._shown_keys):
            return
        widgets = [child for child in self.children if isinstance(child, WideFooterKey)]
        for widget, (binding, enabled, tooltip) in zip(widgets, shown, strict=False):
            widget.show_key(binding.key, self.app.get_key_display(binding),
                            binding.description, binding.action, not enabled, tooltip)
        for widget in widgets[len(shown):]:
            widget.remove()
        new = [WideFooterKey(binding.key, self.app.get_key_display(binding),
                             binding.description, binding.action, disabled=not enabled,
                             tooltip=tooltip)
               for binding, enabled, tooltip in shown[len(widgets):]]
        if new:
            self.mount(*new)
        self.styles.grid_size_columns = len(shown)
        self._shown_keys = shown

    @staticmethod
    def _same(a: list[tuple[Binding, bool, str]], b: list[tuple[Binding, bool, str]]) -> bool:
        return [(x.key, x.description, x.action, e, t) for x, e, t in a] == \
            [(x.key, x.description, x.action, e, t) for x, e, t in b]

    def _fitting_keys(self) -> list[tuple[Binding, bool, str]]:
        items: dict[str, tuple[Binding, bool, str]] = {}
        for _node, binding, enabled, tooltip in self.screen.active_bindings.values():
            if binding.show:
                items.setdefault(binding.action, (binding, enabled, tooltip))
        shown = list(items.values())
        rank: Callable[[str], int] | None = getattr(self.screen, "footer_priority", None)
        width = self.app.size.width
        if rank is not None:
            # + 1: the last key's trailing pad may fall off the edge, its text still shows
            while shown and sum(self._cells(b) for b, _e, _t in shown) > width + 1:
                drop = min(range(len(shown)),
                           key=lambda i: (rank(shown[i][0].action.split("(")[0]), -i))
                del shown[drop]
        return shown

    def _cells(self, binding: Binding) -> int:
        # FooterKey, not compact: " key " then "description "
        return len(self.app.get_key_display(binding)) + len(binding.description) + 3

    def on_resize(self, event: events.Resize) -> None:
        if getattr(self, "_width", None) != self.app.size.width:
            self.call_after_refresh(self.recompose)
