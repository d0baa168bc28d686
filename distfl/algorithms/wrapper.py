"""What holds a method inside it: the base of every feature (feature.py: FedBN, GMA, compression, DP).

As Flower's DP strategy wrappers and pfl-research's postprocessors do, a feature is an object that holds
the method it wraps: it defines the hooks it changes (algorithms/base.py's names and signatures) and
every other attribute is the wrapped method's. The runtime only ever talks to the outermost object, so a
method never knows what wraps it, and any method composes with any feature its rules allow.
"""
from __future__ import annotations


class Wrapper:
    def __init__(self, inner):
        object.__setattr__(self, "inner", inner)
        inner.outer = self  # reaches the method inside every wrapper

    def __getattr__(self, name: str):
        # Only called for what the wrapper does not define itself: the wrapped method's.
        if name == "inner":  # not set yet (an object being copied or unpickled)
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __setattr__(self, name: str, value) -> None:
        # What the wrapper defines (its own state, its hooks) is set on it; the rest is the method's.
        if name in self.__dict__ or hasattr(type(self), name):
            object.__setattr__(self, name, value)
        else:
            setattr(self.inner, name, value)

    def _own(self, **values) -> None:
        """Set the wrapper's own attributes."""
        for name, value in values.items():
            object.__setattr__(self, name, value)

    def overrides(self, hook: str) -> bool:
        """Whether `hook` does something: the wrapper defines it, or the method inside does."""
        return hook in type(self).__dict__ or self.inner.overrides(hook)

    def unwrapped(self):
        """The method inside every wrapper."""
        inner = self.inner
        return inner.unwrapped() if isinstance(inner, Wrapper) else inner

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.inner!r})"
