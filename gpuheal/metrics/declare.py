"""A program's metrics as one class: each metric a class attribute declared once
(name, help, labels), built on the instance's own registry when it is created, so
every metric is exported from the start and a test can build as many sets as it
likes without clashing in the global registry."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Generic, Self, TypeVar, overload

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

M = TypeVar("M", bound=MetricWrapperBase)


class Declared(Generic[M]):
    """One metric of a `Metrics` class. Read on an instance it is the built metric
    (stored in the instance, which shadows this descriptor once built)."""

    def __init__(self, build: Callable[[CollectorRegistry], M]) -> None:
        self.build = build
        self.attribute = ""

    def __set_name__(self, owner: type[Any], name: str) -> None:
        self.attribute = name

    @overload
    def __get__(self, instance: None, owner: type[Any]) -> Self: ...
    @overload
    def __get__(self, instance: Metrics, owner: type[Any]) -> M: ...
    def __get__(self, instance: Metrics | None, owner: type[Any]) -> Self | M:
        if instance is None:
            return self
        # Only reached when the instance has not built it: a subclass forgot super().__init__.
        raise AttributeError(f"{owner.__name__}.{self.attribute} is not built on a registry")


class Metrics:
    """Builds every declared metric on `registry`, in the order declared (the
    order /metrics lists them in)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        for cls in reversed(type(self).__mro__):
            for attribute, declared in vars(cls).items():
                if isinstance(declared, Declared):
                    self.__dict__[attribute] = declared.build(self.registry)


def counter(name: str, documentation: str, *labels: str) -> Declared[Counter]:
    return Declared(lambda registry: Counter(name, documentation, labels, registry=registry))


def gauge(name: str, documentation: str, *labels: str) -> Declared[Gauge]:
    return Declared(lambda registry: Gauge(name, documentation, labels, registry=registry))


def histogram(
    name: str, documentation: str, *labels: str, buckets: Sequence[float]
) -> Declared[Histogram]:
    return Declared(
        lambda registry: Histogram(name, documentation, labels, registry=registry, buckets=buckets)
    )
