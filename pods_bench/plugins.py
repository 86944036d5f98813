"""Registries of plugins that bring their own settings: a plugin registers itself in its own module,
with the dataclass of its settings, and receives them typed; the config keeps what was given.

    STRATEGIES = Registry("allocation strategy", "allocation.strategy")

    @STRATEGIES.register("greso", settings=GresoConfig)   # config section allocation.greso
    class Greso(AllocationStrategy): ...

A registry is a read-only mapping name -> plugin. A config section that chooses one plugin
(`PluginChoice`: allocation.strategy, selection.rule) keeps the plugins' own sections as the plain
mappings given (allocation.greso: {...}); `Registry.typed_settings` builds a plugin's settings
dataclass from its mapping (typed, checked, one-line errors naming the key) when the config is
checked and when the plugin starts. Nothing is rebuilt when a plugin registers, so a plugin
registered later (from a test file, or a user's module imported before the config is read) is
typed like a built-in one.

The registries: allocation strategies (pods_bench/allocation/base.py, sections allocation.<name>),
selection rules (pods_bench/selection.py, sections selection.<name>) and rollout engines
(pods_bench/engines/base.py, typing engine.options of the chosen engine).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

from pods_bench.errors import PodsBenchError
from pods_bench.typed_config import section_from_dict, typed_fields, unknown_config_key


class Registry(Mapping):
    """Named plugins of one kind, each with an optional settings dataclass."""

    def __init__(self, kind: str, config_key: str):
        self.kind, self.config_key = kind, config_key
        self._plugins: dict[str, Any] = {}
        self._settings: dict[str, type] = {}

    def register(self, name: str, settings: type | None = None):
        """Decorator: `plugin` under `name`; `settings` types its config section."""

        def add(plugin):
            if name in self._plugins:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._plugins[name] = plugin
            if settings is not None:
                self._settings[name] = settings
            return plugin

        return add

    def unregister(self, name: str) -> None:
        """Remove plugin `name` (a test's toy, once the test is done)."""
        del self._plugins[name]
        self._settings.pop(name, None)

    def settings(self) -> dict[str, type]:
        """name -> settings dataclass, for the plugins that have one (registration order)."""
        return dict(self._settings)

    def typed_settings(self, choice: PluginChoice, name: str | None = None):
        """The settings of plugin `name` (default: the one `choice` chooses) from the config section
        `choice`: its settings dataclass built from the mapping given under <section>.<name> (the
        dataclass's defaults where nothing was), or None for a plugin without settings. A section
        given for no plugin with settings is a one-line error naming its key."""
        name = choice.chosen() if name is None else name
        given = choice.sections.get(name)
        cls = self._settings.get(name)
        if cls is None:
            if name in choice.sections:
                raise self.unknown_section(name, choice.own_fields())
            return None
        return section_from_dict(cls, given, f"{self.config_key.rsplit('.', 1)[0]}.{name}")

    def unknown_section(self, name: str, also: tuple[str, ...] = ()) -> PodsBenchError:
        """The one-line error for a config section <section>.<name> that no plugin's settings type
        (the closest plugin section, or key `also` of the section itself, as a hint)."""
        section = self.config_key.rsplit(".", 1)[0]
        return unknown_config_key(name, [*also, *self._settings], f"{section}.")

    def check(self, name: str) -> None:
        """A one-line error naming the config key when `name` is not registered."""
        if name not in self._plugins:
            raise PodsBenchError(
                f"config key {self.config_key}: unknown {self.kind} {name!r}; choose from {', '.join(self._plugins)}"
            )

    def __getitem__(self, name: str):
        return self._plugins[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._plugins)

    def __len__(self) -> int:
        return len(self._plugins)


class PluginChoice:
    """A config section (a dataclass) that chooses one plugin of a registry (its field named by
    `choice_field`, e.g. `strategy`) and keeps the plugins' own sections, <section>.<plugin>, as the
    mappings given, in its field `sections` (typed by `Registry.typed_settings`). In a config file
    and in run.json they are keys of the section itself:

        allocation: {strategy: vigor, vigor: {keep_share: 0.5}}
    """

    choice_field = "name"
    sections: dict[str, Any]

    def chosen(self) -> str:
        """The name of the chosen plugin."""
        return getattr(self, self.choice_field)

    @classmethod
    def own_fields(cls) -> tuple[str, ...]:
        """The section's own keys (not plugins' sections)."""
        return tuple(f.name for f in dataclasses.fields(cls) if f.name != "sections")

    @classmethod
    def from_config_dict(cls, data, key: str):
        """The section from plain data: its own fields typed as usual, any other key a plugin's section."""
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise PodsBenchError(f"config key {key} must be a mapping, got {data!r}")
        own = set(cls.own_fields())
        sections = {str(k): v for k, v in data.items() if k not in own}
        for name, value in sections.items():
            if value is not None and not isinstance(value, dict):  # a plugin's section is a mapping
                raise unknown_config_key(name, cls.own_fields(), f"{key}.")
        fields = {k: v for k, v in data.items() if k in own}
        return typed_fields(cls, {**fields, "sections": sections}, key)

    def as_config_dict(self, resolved: dict[str, Any] | None = None) -> dict:
        """The section as a config file writes it: its own fields, then each plugin's section (as
        given, or from `resolved`: name -> typed settings, e.g. the chosen plugin's in full)."""
        data = dataclasses.asdict(self)
        sections = {name: dict(value or {}) for name, value in data.pop("sections").items()}
        for name, settings in (resolved or {}).items():
            if settings is not None:
                sections[name] = dataclasses.asdict(settings)
        return {**data, **sections}
