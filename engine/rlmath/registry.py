"""A table of named functions: how the recipe's names reach the RL math.

Every choice a recipe makes by name in the math (a policy loss, a loss aggregation, a KL
estimator, an off-policy correction, an advantage estimator) is one entry of a `Registry`:
adding one is a decorated function, and an unknown name is one error that lists the known ones.
"""

from __future__ import annotations

from typing import Callable, Generic, Iterator, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Entries of one kind by name, in the order they were registered."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, T] = {}

    def add(self, name: str, entry: T) -> T:
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is registered twice")
        self._entries[name] = entry
        return entry

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: register the decorated function as `name`."""
        return lambda entry: self.add(name, entry)

    def get(self, name: str) -> T:
        if name not in self._entries:
            raise ValueError(f"unknown {self.kind} {name!r}; accepted: {', '.join(self._entries)}")
        return self._entries[name]

    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)
