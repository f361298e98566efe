"""Fields: inference from a first sample, exact encoding, refusals that name the field."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from fastpipe.data.format import fields as F

DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "float32", "float64"]


def _png() -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (4, 3), (1, 2, 3)).save(out, format="PNG")
    return out.getvalue()


@pytest.mark.parametrize("dtype", DTYPES)
def test_an_array_of_every_dtype_round_trips_bit_exact(dtype):
    rng = np.random.default_rng(0)
    array = (rng.integers(0, 2, (3, 5)) if dtype == "bool" else
             rng.standard_normal((3, 5)) * 100).astype(dtype)
    field = F.infer_field(array, "x")
    assert field == F.ArrayField(dtype, (3, 5))
    stored = field.encode(array, "x")
    back = field.value(stored)
    assert back.dtype == torch.from_numpy(array).dtype
    assert back.numpy().tobytes() == array.tobytes()


def test_inference_of_scalars_strings_and_bytes():
    assert F.infer_field(3, "x") == F.IntField("int64")
    assert F.infer_field(True, "x") == F.IntField("bool")
    assert F.infer_field(0.5, "x") == F.FloatField("float64")
    assert F.infer_field(np.float32(0.5), "x") == F.FloatField("float32")
    assert F.infer_field(np.uint8(7), "x") == F.IntField("uint8")
    assert F.infer_field("text", "x") == F.StrField()
    assert F.infer_field(b'{"a": 1}', "x") == F.BytesField()
    assert F.infer_field(_png(), "x") == F.ImageField()
    assert F.infer_field(torch.zeros(2, 3, dtype=torch.int16), "x") == F.ArrayField("int16",
                                                                                    (2, 3))


@pytest.mark.parametrize("field, value", [
    (F.IntField("uint8"), np.uint8(200)), (F.IntField(), 2**62), (F.IntField("bool"), False),
    (F.FloatField(), 0.1), (F.FloatField("float16"), np.float16(1.5)), (F.StrField(), "é ✓"),
    (F.BytesField(), b"\x00\xff"), (F.IntField("uint64"), np.uint64(2**64 - 1)),
])
def test_scalars_strings_and_bytes_round_trip_exactly(field, value):
    back = field.value(field.encode(value, "x"))
    assert back == value and type(back) is type(value)


def test_a_different_dtype_is_refused_naming_the_field_never_cast():
    field = F.ArrayField("float32", (4,))
    with pytest.raises(F.FieldError, match=r"field 'mix' of dataset\[3\] is float64.*float32"):
        field.encode(np.zeros(4), "field 'mix' of dataset[3]")
    with pytest.raises(F.FieldError, match="int32"):
        F.IntField().encode(np.int32(3), "label")
    with pytest.raises(F.FieldError, match="cannot hold exactly"):
        F.FloatField("float32").encode(0.1, "x")
    with pytest.raises(F.FieldError, match="outside uint8's range"):
        F.IntField("uint8").encode(300, "x")


def test_a_shape_that_differs_is_refused_with_the_variable_axis_hint():
    field = F.infer_field(np.zeros((100, 40), np.float32), "x")
    with pytest.raises(F.FieldError, match=r"\(95, 40\).*ArrayField\('float32', \(None, 40\)\)"):
        field.encode(np.zeros((95, 40), np.float32), "field 'key1' of dataset[1]")
    variable = F.ArrayField("float32", (None, 40))
    assert variable.variable and variable.row_shape == (40,)
    assert variable.encode(np.zeros((95, 40), np.float32), "x").shape == (95, 40)
    with pytest.raises(F.FieldError, match=r"shape \(95, 41\)"):
        variable.encode(np.zeros((95, 41), np.float32), "x")


def test_fields_round_trip_through_json():
    for field in (F.ImageField(), F.BytesField(), F.StrField(), F.IntField("uint16"),
                  F.FloatField("float32"), F.ArrayField("int8", (None, 3)),
                  F.ArrayField("float64", ())):
        assert F.field_from_json(field.to_json()) == field


def test_declaring_a_bad_field_says_what_is_wrong():
    with pytest.raises(F.FieldError, match="None allowed only as the first axis"):
        F.ArrayField("float32", (3, None))
    with pytest.raises(F.FieldError, match="numbers and booleans"):
        F.ArrayField("U4", (3,))
    with pytest.raises(F.FieldError, match="cannot hold"):
        F.IntField("float32")
    with pytest.raises(F.FieldError, match="bfloat16"):
        F.infer_field(torch.zeros(2, dtype=torch.bfloat16), "x")
    with pytest.raises(F.FieldError, match="a field holds an array"):
        F.infer_field((np.zeros(2), np.zeros(2)), "field '0' of dataset[0]")
