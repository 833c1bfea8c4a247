"""The gradients' all-reduce in 16 bits (`strategy.all_reduce_dtype`) on
wide_deep's embedding tables (sparse: packed for the gather): in this
process like the rest of issue 20's step tests (test_unit_fastest_step.py),
but ~23 s alone (70 s beside other tests), so in the slow layer: the unit
layer runs the same check on the default MLP's dense gradients."""

import pytest

from test_unit_fastest_step import WIDE_DEEP, assert_16_bit_all_reduce_trains_close_to_float32


@pytest.mark.slow
def test_wide_deep_gradients_all_reduced_in_16_bits_train_weights_close_to_float32(tmp_path):
    assert_16_bit_all_reduce_trains_close_to_float32(tmp_path, "wide_deep", WIDE_DEEP, ["bfloat16"])
