"""The serialized layout form (spec/04-convert.md CONVERT-8, CONVERT-9): the text is the
spec's, written here by hand; it reads back exactly, shard order included, for valid and
invalid layouts of any size; and every malformed text is refused with a ``LayoutError`` that
names the JSON path of the one bad field.

The faults fuzzed here are the spec's list, one per text (see ``conformance.strategies.json``);
torch has no serialized layout form, so this area is unsupported there.
"""

from __future__ import annotations

import pytest
from hypothesis import example, given, strategies as st

from conformance.assertions import assert_equal, describe_layout
from conformance.cases import case
from conformance.impls import Impl, Unsupported
from conformance.strategies import perturbed_layouts, valid_layouts
from conformance.strategies.json import (
    Malformed,
    each_field_out_of_range,
    layout_json,
    malformed_layout_json,
)
from shardspec.metadata import Box, Layout, LayoutError, Shard

# An invalid layout (two boxes overlap, row 3 is missing, rank 0 holds one box twice) still
# round-trips: the reader checks structure, not the layout rules.
BROKEN = Layout(
    (4, 2),
    [
        Shard(Box((0, 0), (2, 2)), 1),
        Shard(Box((1, 0), (1, 2)), 0),
        Shard(Box((1, 0), (1, 2)), 0),
        Shard(Box((4, 0), (0, 2)), 7),
    ],
)


@pytest.mark.rule("CONVERT-8")
@given(st.one_of(valid_layouts(), perturbed_layouts()))
@example(BROKEN)
@example(Layout((), [Shard(Box((), ()), 3)]))
@example(Layout((0, 5), []))
def test_layout_json_is_the_spec_text_and_reads_back_exactly(impl: Impl, layout: Layout) -> None:
    ex = describe_layout(layout)
    with case():
        text = impl.layout_to_json(layout)
        assert_equal("layout_to_json(L)", text, layout_json(layout), ex)
        for form in (text, text.encode()):
            back = impl.layout_from_json(form)
            assert_equal(
                f"layout_from_json({type(form).__name__}).shape", back.shape, layout.shape, ex
            )
            # shard order included: compare the sequences, not the multisets of LAYOUT-5
            assert_equal(
                f"layout_from_json({type(form).__name__}).shards",
                list(back.shards),
                list(layout.shards),
                ex,
            )


@pytest.mark.rule("CONVERT-9")
@given(malformed_layout_json())
@example(
    Malformed(
        '{"format":"shardspec.layout","version":1,"shape":[2,3],"shards":[{"rank":0,'
        '"offsets":[0,0],"sizes":[2,3]},{"rank":1,"offsets":[0,-1],"sizes":[0,3]}]}',
        "field_item",
        ("$.shards[1].offsets[1]",),
    )
)
@example(
    Malformed(
        '{"format":"shardspec.layout","version":1,"shape":[2],"shards":[{"rank":0,'
        '"offsets":[0],"sizes":[1e3]}]}',
        "field_item",
        ("$.shards[0].sizes[0]",),
    )
)
@example(
    Malformed(
        '{"format":"shardspec.layout","version":true,"shape":[2],"shards":[]}',
        "version",
        ("$.version",),
    )
)
def test_every_malformed_text_is_a_layout_error_naming_the_path(impl: Impl, m: Malformed) -> None:
    check_refused(impl, m)


@pytest.mark.rule("CONVERT-9")
@pytest.mark.parametrize("m", each_field_out_of_range(), ids=lambda m: m.fault)
def test_each_int_field_out_of_range_alone_is_refused(impl: Impl, m: Malformed) -> None:
    """Every int field (version, shape, rank, offsets, sizes) negative, below int64, of the
    wrong type or of more than 4300 digits, one at a time: a reader that skips one field's
    check (a negative size read into a Layout) fails here in every run."""
    check_refused(impl, m)


def check_refused(impl: Impl, m: Malformed) -> None:
    ex = repr(m)
    with case():
        try:
            got = impl.layout_from_json(m.text)
        except Unsupported:
            raise
        except LayoutError as e:
            for name in m.names:
                assert_equal(f"{name!r} in str(error)", name in str(e), True, f"{ex}: {e}")
        except Exception as e:  # any other exception is the finding
            raise AssertionError(
                f"layout_from_json raised {type(e).__name__}: {e}, but should raise "
                f"LayoutError [{ex}]"
            ) from e
        else:
            raise AssertionError(f"layout_from_json accepted it as {got!r} [{ex}]")
