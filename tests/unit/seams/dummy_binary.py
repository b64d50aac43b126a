"""A learning task in one file: binary classification under another name (the seam's test needs no more)."""

from insitu.specs.binary import BinaryClassification


class DummyBinary(BinaryClassification):
    name = "dummy_binary"
