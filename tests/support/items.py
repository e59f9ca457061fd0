"""Comparing kwargs item data in tests: arrays by dtype, shape and bytes; lists in order."""

from __future__ import annotations

from typing import Any

import numpy as np


def assert_nested_equal(a: Any, b: Any) -> None:
    if isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray)
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.tobytes() == b.tobytes()
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_nested_equal(x, y)
    else:
        assert a == b and type(a) is type(b)
