"""Property tests: any item we can build round-trips, and random bytes only raise WireError."""

from __future__ import annotations

import ml_dtypes
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tandem_wire import (
    BatchedLayout,
    FieldElem,
    FlatLayout,
    SharedLayout,
    WireError,
    decode_item,
    encode_item,
)

from .test_codec_roundtrip import assert_items_equal

DTYPES = [
    np.float32,
    np.float16,
    np.float64,
    np.uint8,
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.bool_,
]

arrays = st.one_of(
    hnp.arrays(
        dtype=st.sampled_from(DTYPES),
        shape=hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=6),
    ),
    hnp.arrays(
        dtype=np.float32,
        shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=6),
        elements=st.floats(-1e4, 1e4, width=32),
    ).map(lambda a: a.astype(ml_dtypes.bfloat16)),
)

nested = st.recursive(
    arrays | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False),
    lambda children: st.lists(children, max_size=3),
    max_leaves=6,
)


@st.composite
def flat_fields(draw):
    """A flat field with well-formed slices (vLLM's slices index the batch an item came
    from, so they are not bounded by the item's own tensor)."""
    data = draw(
        hnp.arrays(
            dtype=st.sampled_from(DTYPES),
            shape=hnp.array_shapes(min_dims=1, max_dims=4, min_side=0, max_side=6),
        )
    )
    dim = draw(st.integers(0, data.ndim - 1))
    size = data.shape[dim]

    def cut():
        start = draw(st.none() | st.integers(0, size))
        stop = draw(st.none() | st.integers(start or 0, size))
        return slice(start, stop, draw(st.none() | st.integers(1, 3)))

    if dim == 0:
        cuts = tuple(cut() for _ in range(draw(st.integers(0, 4))))
    else:
        # One slice per leading dimension up to dim: full ones, then the cut along dim.
        cuts = tuple((*(slice(None),) * dim, cut()) for _ in range(draw(st.integers(1, 3))))
    return FieldElem(data=data, layout=FlatLayout(slices=cuts, dim=dim, keep_on_cpu=False))


layouts = st.one_of(
    st.builds(BatchedLayout, keep_on_cpu=st.booleans()),
    st.builds(SharedLayout, batch_size=st.integers(1, 64), keep_on_cpu=st.booleans()),
)

items = st.dictionaries(
    st.text(min_size=1, max_size=20),
    st.builds(FieldElem, data=st.none() | nested, layout=layouts) | flat_fields(),
    max_size=4,
)


@settings(max_examples=150, deadline=None)
@given(items)
def test_any_item_roundtrips(item):
    assert_items_equal(item, decode_item(encode_item(item)))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=256))
def test_random_bytes_raise_only_wire_errors(data):
    try:
        decode_item(data)
    except WireError:
        pass


@settings(max_examples=200, deadline=None)
@given(items, st.data())
def test_corrupted_encodings_raise_only_wire_errors(item, data):
    buf = bytearray(encode_item(item))
    if not buf:
        return
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(buf) - 1))
        buf[pos] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(buf)))
    try:
        decode_item(bytes(buf[:cut]))
    except WireError:
        pass
