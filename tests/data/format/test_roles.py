"""Roles (fastpipe/data/format/roles.py) and the fields that carry them
(fastpipe/data/format/fields.py): the kinds' defaults, the combinations refused when a field is
made, the role in the schema JSON and back, schemas written before roles, and a role name nobody
registered."""

from __future__ import annotations

import json
import pickle
from dataclasses import dataclass
from typing import ClassVar

import pytest

from fastpipe.data import (
    Array,
    ArrayField,
    BoundingBoxes,
    Bytes,
    BytesField,
    FloatField,
    Image,
    ImageField,
    IntField,
    Label,
    Mask,
    Role,
    StrField,
    Text,
    register_role,
)
from fastpipe.data.format import fields as F
from fastpipe.data.format import roles as R


def test_every_kind_has_its_default_role():
    assert ImageField().role == Image()
    assert ArrayField("float32", (3,)).role == Array()
    assert IntField().role == Array() and FloatField().role == Array()
    assert BytesField().role == Bytes() and StrField().role == Text()
    # The default is the same field as one declared with it.
    assert ImageField(role=Image()) == ImageField() and ImageField(role=Mask()) != ImageField()


ROLES = [Image(), Mask(), BoundingBoxes(), BoundingBoxes("xywh", "image"),
         BoundingBoxes("cxcywh", "hr"), Label(), Array(), Bytes(), Text()]


@pytest.mark.parametrize("role", ROLES, ids=repr)
def test_roles_round_trip_through_json(role):
    data = json.loads(json.dumps(role.to_json()))
    assert data["name"] == role.name
    back = Role.from_json(data)
    assert type(back) is type(role) and back == role
    assert type(role).from_json(data) == role


def test_box_formats_are_torchvisions():
    tv = pytest.importorskip("torchvision", exc_type=ImportError)
    from torchvision import tv_tensors

    del tv
    assert BoundingBoxes(tv_tensors.BoundingBoxFormat.XYWH).format == "xywh"
    assert BoundingBoxes("CXCYWH").format == "cxcywh"
    assert BoundingBoxes().to_json() == {"name": "boxes", "format": "xyxy", "canvas": None}
    with pytest.raises(ValueError, match="format must be one of"):
        BoundingBoxes(tv_tensors.BoundingBoxFormat.XYWHR)
    with pytest.raises(ValueError, match="format must be one of"):
        BoundingBoxes("yxyx")
    with pytest.raises(ValueError, match="canvas"):
        BoundingBoxes(canvas=3)


FIELDS = [
    ImageField(role=Mask()),
    ArrayField("float32", (None, 4), role=BoundingBoxes("xywh", canvas="image")),
    ArrayField("float16", (7, 4), role=BoundingBoxes("cxcywh")),
    ArrayField("uint16", (None, 64), role=Mask()),
    ArrayField("uint8", (32, 32, 3), role=Image()),
    IntField("int64", role=Label()),
    IntField("uint8", role=Label()),
]


@pytest.mark.parametrize("field", FIELDS, ids=repr)
def test_a_field_stores_its_role_and_reads_it_back(field):
    data = json.loads(json.dumps(field.to_json()))
    assert data["role"] == field.role.to_json()
    back = F.field_from_json(data)
    assert back == field and back.role == field.role
    assert pickle.loads(pickle.dumps(field)) == field


def test_the_docs_example_of_a_stored_role():
    field = ArrayField("float32", (None, 4), role=BoundingBoxes("xywh", canvas="image"))
    assert field.to_json() == {"kind": "array", "dtype": "float32", "shape": [None, 4],
                               "role": {"name": "boxes", "format": "xywh", "canvas": "image"}}


@pytest.mark.parametrize("data, field", [
    ({"kind": "image"}, ImageField()),
    ({"kind": "array", "dtype": "float32", "shape": [None, 4]}, ArrayField("float32", (None, 4))),
    ({"kind": "int", "dtype": "int64"}, IntField()),
    ({"kind": "float", "dtype": "float32"}, FloatField("float32")),
    ({"kind": "bytes"}, BytesField()),
    ({"kind": "str"}, StrField()),
])
def test_a_schema_written_before_roles_reads_with_the_kinds_defaults(data, field):
    """Packs written before roles store fields without one: they read as the kind's default, and
    a field of the default role writes the same JSON as then (so such packs are unchanged)."""
    back = F.field_from_json(data)
    assert back == field and back.role == type(field).default_role()
    assert field.to_json() == data


def test_an_unknown_role_names_itself_and_says_to_import_its_module():
    with pytest.raises(F.UnknownRoleError, match=r"unknown field role 'keypoints3d'.*import the "
                                                 r"module that defines and registers it"):
        F.field_from_json({"kind": "array", "dtype": "float32", "shape": [None, 3],
                           "role": {"name": "keypoints3d"}})
    with pytest.raises(F.FieldError, match=r"role .*'polygon'.* cannot be read: BoundingBoxes: "
                                           "format must be") as caught:
        F.field_from_json({"kind": "array", "dtype": "float32", "shape": [None, 4],
                           "role": {"name": "boxes", "format": "polygon"}})
    assert not isinstance(caught.value, F.UnknownRoleError)  # a known role, damaged settings
    with pytest.raises(F.FieldError, match="cannot be read: BoundingBoxes.*'angle'"):
        F.field_from_json({"kind": "array", "dtype": "float32", "shape": [None, 4],
                           "role": {"name": "boxes", "angle": 3}})


@pytest.mark.parametrize("make, message", [
    (lambda: ImageField(role=BoundingBoxes()), "float \\(N, 4\\) boxes"),
    (lambda: ImageField(role=Label()), "Label is one class index: an IntField"),
    (lambda: ImageField(role=Text()), "role of a StrField"),
    (lambda: ArrayField("float32", (None, 4), role=Mask()), "Mask\\(\\) is pixels.*float32"),
    (lambda: ArrayField("uint8", (16,), role=Image()), "shape \\(H, W\\) or \\(H, W, C\\)"),
    (lambda: ArrayField("int32", (None, 4), role=BoundingBoxes()), "int32, shape \\(None, 4\\)"),
    (lambda: ArrayField("float32", (None, 5), role=BoundingBoxes()), "shape \\(None, 5\\)"),
    (lambda: ArrayField("float32", (4,), role=BoundingBoxes()), "shape \\(4,\\)"),
    (lambda: IntField(role=Text()), "role of a StrField"),
    (lambda: FloatField(role=Label()), "IntField"),
    (lambda: StrField(role=Array()), "Array is numbers"),
    (lambda: BytesField(role=Image()), "Image\\(\\) is pixels"),
    (lambda: ImageField(role=Array()), "its role is Image or Mask"),
    (lambda: ImageField(role=Mask), "pass Mask\\(\\), not the class"),
    (lambda: ImageField(role="mask"), "role must be a fastpipe.data Role"),
])
def test_a_role_that_does_not_fit_the_kind_is_refused_when_the_field_is_made(make, message):
    with pytest.raises(F.FieldError, match=message):
        make()


def test_register_role_refuses_what_cannot_be_a_role():
    with pytest.raises(TypeError, match="Role subclass"):
        register_role(dict)

    @dataclass(frozen=True)
    class Nameless(Role):
        pass

    with pytest.raises(ValueError, match="needs a name"):
        register_role(Nameless)

    @dataclass(frozen=True)
    class Impostor(Role):
        name: ClassVar[str] = "mask"

    with pytest.raises(ValueError, match="'mask' is taken by fastpipe.data.format.roles.Mask"):
        register_role(Impostor)
    assert R._ROLES["mask"] is Mask
    with pytest.raises(ValueError, match="Mask.from_json was given the role 'image'"):
        Mask.from_json({"name": "image"})


def test_a_role_registered_outside_fastpipe_round_trips(monkeypatch):
    @dataclass(frozen=True)
    class Depth(Role):
        """Depth in metres, as float pixels (an example of a role with a setting)."""

        scale: float = 1.0
        name: ClassVar[str] = "test-depth"

        def check(self, field):
            if field.kind != "array" or not field.dtype.startswith("float"):
                raise ValueError("Depth is a float array")

    monkeypatch.setitem(R._ROLES, "test-depth", Depth)  # registered for this test only
    assert register_role(Depth) is Depth
    field = ArrayField("float32", (None, 8), role=Depth(0.001))
    assert F.field_from_json(json.loads(json.dumps(field.to_json()))) == field
    with pytest.raises(F.FieldError, match="Depth is a float array"):
        ArrayField("uint8", (None, 8), role=Depth())
