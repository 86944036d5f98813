"""Registries of plugins that bring their own settings: a plugin registers itself in its own module,
with the dataclass of its config section, and the config is typed from the registry.

    STRATEGIES = Registry("allocation strategy", "allocation.strategy")

    @STRATEGIES.register("greso", settings=GresoConfig)   # config section allocation.greso
    class Greso(AllocationStrategy): ...

A registry is a read-only mapping name -> plugin. Listeners (`on_register`) hear of every change,
so a config section built from the registry (`with_sections`) can follow a plugin registered later
(from a test file, or a user's module imported before the config is read).

The registries: allocation strategies (pods_bench/allocation/base.py, sections allocation.<name>),
selection rules (pods_bench/selection.py, sections selection.<name>) and rollout engines
(pods_bench/engines/base.py, typing engine.options of the chosen engine).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from pods_bench.errors import PodsBenchError


class Registry(Mapping):
    """Named plugins of one kind, each with an optional settings dataclass."""

    def __init__(self, kind: str, config_key: str):
        self.kind, self.config_key = kind, config_key
        self._plugins: dict[str, Any] = {}
        self._settings: dict[str, type] = {}
        self._listeners: list[Callable[[], None]] = []

    def register(self, name: str, settings: type | None = None):
        """Decorator: `plugin` under `name`; `settings` types its config section."""

        def add(plugin):
            if name in self._plugins:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._plugins[name] = plugin
            if settings is not None:
                self._settings[name] = settings
            for listener in self._listeners:
                listener()
            return plugin

        return add

    def unregister(self, name: str) -> None:
        """Remove plugin `name` (a test's toy, once the test is done)."""
        del self._plugins[name]
        self._settings.pop(name, None)
        for listener in self._listeners:
            listener()

    def settings(self) -> dict[str, type]:
        """name -> settings dataclass, for the plugins that have one (registration order)."""
        return dict(self._settings)

    def on_register(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

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


def with_sections(name: str, base: type, registry: Registry, module: str) -> type:
    """Dataclass `name`: `base` plus a field per plugin of `registry` that has settings, named after
    the plugin and typed by its settings dataclass (default: the dataclass's defaults). It keeps
    `base`'s docstring and checks (`__post_init__`); `module` is where it is published."""
    sections = [(plugin, cls, dataclasses.field(default_factory=cls)) for plugin, cls in registry.settings().items()]
    cls = dataclasses.make_dataclass(name, sections, bases=(base,), namespace={"__doc__": base.__doc__})
    cls.__module__ = module  # (make_dataclass takes `module` only from Python 3.12 on)
    return cls
