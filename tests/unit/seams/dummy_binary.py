"""A learning task in one file: binary classification under another name, with its own metrics document (the
exchange's union of metrics is assembled from the tasks, so this one is accepted from sites too)."""

from typing import ClassVar, Literal

from insitu.federated.documents.base import Doc
from insitu.specs.binary import BinaryClassification, BinaryMetrics


class DummyBinaryMetrics(BinaryMetrics):
    task: Literal["dummy_binary"]  # type: ignore[assignment]


class DummyBinary(BinaryClassification):
    name = "dummy_binary"
    metrics_schema: ClassVar[type[Doc]] = DummyBinaryMetrics
