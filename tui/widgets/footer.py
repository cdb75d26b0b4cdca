"""The footer: the keys that matter in the current mode, as many as fit on one line."""

from __future__ import annotations

from collections.abc import Callable

from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import Footer
from textual.widgets._footer import FooterKey


class FitFooter(Footer):
    """Textual's footer, but a key that does not fit is left out instead of cut: the
    screen's `footer_priority(action)` ranks the keys shown in its mode (higher stays),
    and the lowest-ranked, rightmost ones go first until the rest fit the width. `?` lists
    every key anyway."""

    def compose(self) -> ComposeResult:
        if not self._bindings_ready:
            return
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
        self.styles.grid_size_columns = len(shown)
        self._width = width
        for binding, enabled, tooltip in shown:
            yield FooterKey(
                binding.key,
                self.app.get_key_display(binding),
                binding.description,
                binding.action,
                disabled=not enabled,
                tooltip=tooltip,
            ).data_bind(compact=Footer.compact)

    def _cells(self, binding: Binding) -> int:
        # FooterKey, not compact: " key " then "description "
        return len(self.app.get_key_display(binding)) + len(binding.description) + 3

    def on_resize(self, event: events.Resize) -> None:
        if getattr(self, "_width", None) != self.app.size.width:
            self.call_after_refresh(self.recompose)
