"""DataPrefetcher and the batch shapes a collate_fn builds: dataclasses, namedtuples, dict
subclasses, detection batches of variable-size images, several image entries, a target named for
batch_transform, and the batches it must refuse (fastpipe/_batch.py through its one user)."""

from __future__ import annotations

import ast
import collections
import dataclasses
import re
from collections import OrderedDict, defaultdict, namedtuple

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import fastpipe.prefetch as prefetch_module
from fastpipe import DataPrefetcher
from tests.helpers.cuda import RecordingStreams

pytestmark = pytest.mark.timeout(60)

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


@dataclasses.dataclass
class Sample:
    image: torch.Tensor
    label: torch.Tensor
    name: str = "batch"


@dataclasses.dataclass(frozen=True)
class FrozenSample:
    image: torch.Tensor
    mask: torch.Tensor
    meta: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Derived:
    """A dataclass with an init=False field its __post_init__ sets, and one changed after."""

    image: torch.Tensor
    weights: torch.Tensor = dataclasses.field(init=False)
    steps: int = dataclasses.field(init=False, default=0)
    post_inits: int = dataclasses.field(init=False, default=0)

    def __post_init__(self) -> None:
        self.weights = torch.ones(len(self.image))
        self.post_inits += 1


@dataclasses.dataclass
class WithInitVar:
    image: torch.Tensor
    scale: dataclasses.InitVar[float]
    scaled: float = 0.0

    def __post_init__(self, scale: float) -> None:
        self.scaled = scale * 2


@dataclasses.dataclass
class Unlabelled:
    label: torch.Tensor
    pixels: torch.Tensor


class Meta(dict):
    """A dict subclass of the user's own, which must keep its type."""


Triple = namedtuple("Triple", ["label", "pixels", "name"])


def _images(n: int = 2, seed: int = 0, size=(5, 4)) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 3, *size), dtype=torch.uint8, generator=g)


def _reference(images: torch.Tensor) -> torch.Tensor:
    """torchvision's Normalize after ToTensor's scaling, in float64."""
    mean = torch.tensor(MEAN, dtype=torch.float64).view(-1, 1, 1)
    std = torch.tensor(STD, dtype=torch.float64).view(-1, 1, 1)
    return ((images.double() / 255 - mean) / std).float()


def _detection_batch(seed: int = 0):
    """torchvision's detection batch: a tuple of variable-size uint8 images and a tuple of
    target dicts (one with no boxes)."""
    g = torch.Generator().manual_seed(seed)
    sizes = [(7, 5), (4, 9), (6, 6)]
    images = tuple(torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=g)
                   for h, w in sizes)
    targets = tuple(
        {"boxes": torch.rand(k, 4, generator=g) * 4, "labels": torch.arange(k) + 1,
         "image_id": i}
        for i, k in enumerate((2, 0, 3))
    )
    return images, targets


@pytest.fixture
def recording(monkeypatch):
    streams = RecordingStreams()
    monkeypatch.setattr(prefetch_module, "streams_for", lambda device: streams)
    return streams


def _walk(node, path="batch"):
    """(path, leaf) of every leaf, looking into dataclasses, mappings and sequences."""
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        for field in dataclasses.fields(node):
            yield from _walk(getattr(node, field.name), f"{path}.{field.name}")
    elif isinstance(node, collections.abc.Mapping):
        for key, value in node.items():
            yield from _walk(value, f"{path}[{key!r}]")
    elif isinstance(node, (tuple, list, collections.deque)):
        for index, value in enumerate(node):
            yield from _walk(value, f"{path}[{index}]")
    else:
        yield path, node


def _check_moved_once(recording, batch, out) -> None:
    """Every tensor of ``batch`` copied exactly once (a tensor at two places too), on the side
    stream and non-blocking; its
    copy is where it was in ``out`` (same values), every other leaf is the same object, and
    every tensor handed over is recorded on the consumer's stream."""
    before, after = list(_walk(batch)), list(_walk(out))
    assert [path for path, _ in before] == [path for path, _ in after]
    inputs = {id(leaf): leaf for _, leaf in before if isinstance(leaf, torch.Tensor)}
    assert inputs, "the batch must hold tensors for this check to mean anything"
    assert sorted(map(id, recording.copied)) == sorted(inputs), "each copied once"
    copies = [entry for entry in recording.log if entry[0] == "copy"]
    assert all(stream == "side1" and non_blocking for _, _, stream, non_blocking in copies)
    for (path, old), (_, new) in zip(before, after):
        if isinstance(old, torch.Tensor):
            assert new is not old and torch.equal(new, old), f"{path} was not moved"
        else:
            assert new is old, f"{path} is not the same object"
    handed = [leaf for _, leaf in after if isinstance(leaf, torch.Tensor)]
    on_consumer = {id(tensor) for tensor, stream in recording.recorded if stream == "default"}
    assert all(id(tensor) in on_consumer for tensor in handed)


# --- every tensor moves, every container keeps its type ---


def _shapes():
    image, mask = _images(seed=1), torch.randint(0, 5, (2, 5, 4))
    derived = Derived(_images(seed=2))
    derived.steps = 7
    return {
        "dataclass": Sample(image, torch.tensor([1, 2])),
        "frozen dataclass": FrozenSample(image, mask, {"paths": ["a.png", "b.png"]}),
        "init=False fields": derived,
        "InitVar dataclass": WithInitVar(image, scale=1.5),
        "dict subclass": Meta(image=image, label=torch.tensor([3, 4]), names=("a", "b")),
        "OrderedDict": OrderedDict(image=image, mask=mask),
        "defaultdict": defaultdict(list, image=image, extra=[torch.zeros(2), "s"]),
        "namedtuple": Triple(torch.tensor([5, 6]), image, "n"),
        "nested": [{"sample": Sample(image, torch.tensor([1, 2])), "meta": {"id": 3}},
                   (FrozenSample(image, mask), None)],
        "detection": _detection_batch(),
        "list of images": [[img for img in _detection_batch()[0]], torch.tensor([0, 1, 2])],
        "deque": collections.deque([image, "x"], maxlen=4),
    }


@pytest.mark.parametrize("shape", list(_shapes()))
def test_every_tensor_is_copied_once_on_the_side_stream_and_the_rest_is_untouched(
        recording, shape):
    batch = _shapes()[shape]
    (out,) = list(DataPrefetcher([batch], device="cpu"))
    assert type(out) is type(batch)
    _check_moved_once(recording, batch, out)


def test_dataclasses_are_rebuilt_with_their_fields_and_defaults_kept(recording):
    derived = Derived(_images())
    derived.steps = 7
    frozen = FrozenSample(_images(), torch.zeros(2, 5, 4, dtype=torch.int64), {"k": "v"})
    with_initvar = WithInitVar(_images(), scale=1.5)
    out_derived, out_frozen, out_initvar = list(
        DataPrefetcher([derived, frozen, with_initvar], device="cpu"))
    # init=False fields: moved (weights) or kept (steps) from the batch, not reset by __init__.
    assert out_derived.steps == 7 and out_derived.weights is not derived.weights
    assert torch.equal(out_derived.weights, derived.weights)
    assert out_frozen.meta is frozen.meta
    with pytest.raises(dataclasses.FrozenInstanceError):
        out_frozen.image = None
    assert out_initvar.scaled == 3.0 and out_initvar.image is not with_initvar.image


def test_a_dict_subclass_is_moved_and_normalized_and_keeps_its_type(no_thread_leak):
    batch = Meta(image=_images(), label=torch.tensor([1, 2]))
    (out,) = list(DataPrefetcher([batch], device="cpu", mean=MEAN, std=STD))
    assert type(out) is Meta
    torch.testing.assert_close(out["image"], _reference(batch["image"]))


# --- dataclass batches: normalized by default and by image_key ---


@pytest.mark.parametrize("image_key", [None, "image"])
def test_a_dataclass_batch_is_normalized(image_key, no_thread_leak):
    batches = [Sample(_images(seed=k), torch.tensor([k, k]), f"b{k}") for k in range(3)]
    out = list(DataPrefetcher(batches, device="cpu", mean=MEAN, std=STD, image_key=image_key))
    for raw, got in zip(batches, out):
        assert type(got) is Sample and got.name is raw.name
        torch.testing.assert_close(got.image, _reference(raw.image))
        assert got.label.dtype == torch.int64 and torch.equal(got.label, raw.label)


def test_a_dataclass_batch_on_the_stream_path_is_copied_then_normalized(recording):
    batch = Sample(_images(), torch.tensor([1, 2]))
    (out,) = list(DataPrefetcher([batch], device="cpu", mean=MEAN, std=STD))
    torch.testing.assert_close(out.image, _reference(batch.image))
    # The uint8 images and the labels copied (mean and std once each), all on the side stream.
    copied = [tensor for tensor in recording.copied if tensor.dtype != torch.float32]
    assert [id(t) for t in copied] == [id(batch.image), id(batch.label)]
    assert all(entry[2] == "side1" for entry in recording.log if entry[0] == "copy")


def _suggested(message: str):
    """The value of the first ``image_key=...`` an error message suggests."""
    found = re.search(r"image_key=('[^']*'|-?\d+|\([^)]*\))", message)
    assert found, message
    return ast.literal_eval(found.group(1))


@pytest.mark.parametrize("batch", [
    Unlabelled(torch.tensor([1, 2]), _images()),
    Triple(torch.tensor([1, 2]), _images(), "t"),
    (torch.tensor([1, 2]), _images()),
    {"pixels": _images(), "label": torch.tensor([1, 2])},
    (torch.tensor([1, 2]), list(_images())),
], ids=["dataclass", "namedtuple", "tuple", "dict", "tuple-of-list"])
@pytest.mark.slow
def test_the_image_key_an_error_suggests_works_for_the_batch_at_hand(batch, no_thread_leak):
    with pytest.raises((TypeError, ValueError), match="image_key=") as caught:
        list(DataPrefetcher([batch], device="cpu", mean=MEAN, std=STD))
    key = _suggested(str(caught.value))
    (out,) = list(DataPrefetcher([batch], device="cpu", mean=MEAN, std=STD, image_key=key))
    assert all(t.dtype == torch.float32 for _, t in _walk(out)
               if isinstance(t, torch.Tensor) and t.dim() >= 3)


def test_an_image_key_naming_nothing_lists_the_fields_and_suggests_one(no_thread_leak):
    batch = Unlabelled(torch.tensor([1, 2]), _images())
    with pytest.raises(ValueError, match=r"image_key='img' names no entry.*'label', 'pixels'.*"
                                         r"image_key='pixels'"):
        list(DataPrefetcher([batch], device="cpu", mean=MEAN, std=STD, image_key="img"))
    with pytest.raises(ValueError, match="image_key=5 names no entry"):
        list(DataPrefetcher([(_images(), torch.zeros(2))], device="cpu", dtype=torch.float32,
                            image_key=5))


def test_a_batch_without_images_says_so(no_thread_leak):
    with pytest.raises(TypeError, match="no entry of this Unlabelled batch holds images"):
        list(DataPrefetcher([Unlabelled(torch.tensor([1, 2]), torch.zeros(2, 3))],
                            device="cpu", dtype=torch.float32))


# --- detection batches: variable-size images, normalized one by one ---


@pytest.mark.parametrize("image_key", [None, 0])
def test_a_detection_batch_is_normalized_image_by_image(image_key, no_thread_leak):
    images, targets = _detection_batch()
    (out,) = list(DataPrefetcher([(images, targets)], device="cpu", mean=MEAN, std=STD,
                                 image_key=image_key, channels_last=True))
    out_images, out_targets = out
    assert type(out) is tuple and type(out_images) is tuple and len(out_images) == 3
    for raw, got in zip(images, out_images):
        assert got.shape == raw.shape and got.dtype == torch.float32
        torch.testing.assert_close(got, _reference(raw.unsqueeze(0))[0])
    for raw, got in zip(targets, out_targets):
        assert got.keys() == raw.keys() and got["image_id"] == raw["image_id"]
        assert torch.equal(got["boxes"], raw["boxes"]) and torch.equal(got["labels"],
                                                                       raw["labels"])


class _Detection(Dataset):
    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(i)
        image = torch.randint(0, 256, (3, 4 + i, 9 - i), dtype=torch.uint8, generator=g)
        return image, {"boxes": torch.tensor([[0.0, 0.0, 2.0, 2.0]] * (i % 3)).reshape(-1, 4),
                       "labels": torch.ones(i % 3, dtype=torch.int64)}


def test_a_detection_loader_with_torchvisions_collate_goes_through(recording):
    loader = DataLoader(_Detection(), batch_size=3, collate_fn=lambda b: tuple(zip(*b)))
    out = list(DataPrefetcher(loader, device="cpu", dtype=torch.float32))
    assert len(out) == 2
    for k, (images, targets) in enumerate(out):
        for j, (image, target) in enumerate(zip(images, targets)):
            i = 3 * k + j
            raw, raw_target = _Detection()[i]
            torch.testing.assert_close(image, raw.float() / 255)
            assert torch.equal(target["boxes"], raw_target["boxes"])
    # Per batch: 3 images, 3 boxes and 3 labels tensors, each copied once on the side stream;
    # and the zeros and ones that dtype alone normalizes with, once.
    copies = [entry for entry in recording.log if entry[0] == "copy"]
    assert len(recording.copied) == 2 * 9 + 2
    assert all(stream == "side1" for _, _, stream, _ in copies)


# --- several image entries, and the target named for batch_transform ---


def test_several_image_entries_are_each_normalized(no_thread_leak):
    batch = {"lr": _images(size=(4, 4), seed=1), "hr": _images(size=(8, 8), seed=2),
             "name": "x"}
    (out,) = list(DataPrefetcher([batch], device="cpu", mean=MEAN, std=STD,
                                 image_key=("lr", "hr")))
    torch.testing.assert_close(out["lr"], _reference(batch["lr"]))
    torch.testing.assert_close(out["hr"], _reference(batch["hr"]))
    assert out["name"] is batch["name"]


def _flip_both(images, masks):
    """A joint op on image and mask (as CutMix on a segmentation batch is)."""
    return images.flip(-1), masks.flip(-1)


@pytest.mark.slow
@pytest.mark.parametrize("batch_type", ["dict", "dataclass", "tuple"])
def test_target_key_passes_the_named_entry_to_batch_transform(batch_type, no_thread_leak):
    images, mask = _images(), torch.randint(0, 5, (2, 5, 4))
    labels = torch.tensor([1, 2])
    batch, key = {
        "dict": ({"image": images, "label": labels, "mask": mask}, "mask"),
        "dataclass": (FrozenSample(images, mask), "mask"),
        "tuple": ((images, labels, mask), 2),
    }[batch_type]
    (out,) = list(DataPrefetcher([batch], device="cpu", mean=MEAN, std=STD,
                                 batch_transform=_flip_both, target_key=key))
    get = {"dict": lambda b, k: b[k], "dataclass": getattr, "tuple": lambda b, k: b[k]}[batch_type]
    image_key = {"dict": "image", "dataclass": "image", "tuple": 0}[batch_type]
    torch.testing.assert_close(get(out, image_key), _reference(images).flip(-1))
    assert torch.equal(get(out, key), mask.flip(-1))
    if batch_type != "dataclass":  # the default target is left as it was
        assert torch.equal(get(out, "label" if batch_type == "dict" else 1), labels)


def test_several_keys_pass_and_take_tuples(no_thread_leak):
    batch = {"lr": _images(seed=1), "hr": _images(seed=2), "mask": torch.ones(2, 5, 4),
             "label": torch.tensor([1, 2])}
    seen = []

    def transform(images, targets):
        seen.append((len(images), len(targets)))
        lr, hr = images
        mask, label = targets
        return (lr + 1, hr + 2), (mask * 3, label * 4)

    (out,) = list(DataPrefetcher([batch], device="cpu", dtype=torch.float32,
                                 image_key=["lr", "hr"], target_key=("mask", "label"),
                                 batch_transform=transform))
    assert seen == [(2, 2)]
    torch.testing.assert_close(out["lr"], batch["lr"].float() / 255 + 1)
    torch.testing.assert_close(out["hr"], batch["hr"].float() / 255 + 2)
    assert torch.equal(out["mask"], torch.full((2, 5, 4), 3.0))
    assert out["label"].tolist() == [4, 8]
    with pytest.raises(TypeError, match="must return targets as a tuple of as many"):
        list(DataPrefetcher([batch], device="cpu", image_key=["lr", "hr"],
                            target_key=("mask", "label"),
                            batch_transform=lambda x, y: (x, y[0])))


def test_default_targets_of_dataclass_and_detection_batches(no_thread_leak):
    seen = []

    def transform(images, targets):
        seen.append((type(images).__name__, type(targets).__name__))
        return images, targets

    prefetcher = DataPrefetcher([Sample(_images(), torch.tensor([1, 2])), _detection_batch()],
                                device="cpu", batch_transform=transform)
    list(prefetcher)
    assert seen == [("Tensor", "Tensor"), ("tuple", "tuple")]


def test_target_key_is_checked(no_thread_leak):
    with pytest.raises(ValueError, match="target_key names the entry passed to batch_transform"):
        DataPrefetcher([], device="cpu", target_key="mask")
    with pytest.raises(ValueError, match="image_key must name at least one entry"):
        DataPrefetcher([], device="cpu", image_key=())
    with pytest.raises(ValueError, match=r"target_key='masks' names no entry.*'mask'"):
        list(DataPrefetcher([{"image": _images(), "mask": torch.zeros(2)}], device="cpu",
                            batch_transform=_flip_both, target_key="masks"))


# --- batches the walker cannot see through ---


class Opaque:
    """An object keeping its tensors in attributes."""

    def __init__(self, images: torch.Tensor) -> None:
        self.images = images


class Described:
    def __init__(self) -> None:
        self.text = "no tensors here"


@pytest.mark.parametrize("batch, type_name", [
    ({_images()[0], _images()[1]}, "set"),
    (Opaque(_images()), "Opaque"),
    ({"image": _images(), "extra": [Opaque(_images())]}, "Opaque"),
    (frozenset({torch.zeros(1)}), "frozenset"),
], ids=["set", "object", "nested-object", "frozenset"])
def test_an_unsupported_batch_is_an_error_naming_its_type_and_the_fix(
        recording, batch, type_name):
    with pytest.raises(TypeError, match=rf"a {type_name}: .*would stay on the host\. Fix: make "
                                        "it a dict, a list or tuple, a namedtuple or a dataclass"):
        list(DataPrefetcher([batch], device="cpu"))
    assert recording.copied == []


def test_objects_without_tensors_pass_as_the_same_object(recording):
    described, names = Described(), {"a", "b"}
    batch = {"image": _images(), "info": described, "names": names}
    (out,) = list(DataPrefetcher([batch], device="cpu"))
    assert out["info"] is described and out["names"] is names
    assert out["image"] is not batch["image"] and torch.equal(out["image"], batch["image"])


def test_a_tensor_at_two_places_is_copied_once_and_stays_one_tensor(recording):
    images = _images()
    batch = {"image": images, "input": images, "label": torch.tensor([1, 2])}
    (out,) = list(DataPrefetcher([batch], device="cpu"))
    assert [id(t) for t in recording.copied] == [id(images), id(batch["label"])]
    assert out["image"] is out["input"] and out["image"] is not images


def test_torchvision_tv_tensors_keep_their_type_and_metadata(recording):
    tv_tensors = pytest.importorskip("torchvision.tv_tensors")
    boxes = tv_tensors.BoundingBoxes([[0, 0, 2, 3]], format="XYXY", canvas_size=(5, 4))
    batch = ([tv_tensors.Image(_images()[0])], [{"boxes": boxes,
                                                  "masks": tv_tensors.Mask(torch.ones(1, 5, 4))}])
    (out,) = list(DataPrefetcher([batch], device="cpu"))
    _check_moved_once(recording, batch, out)
    moved = out[1][0]["boxes"]
    assert type(moved) is tv_tensors.BoundingBoxes and moved.canvas_size == (5, 4)
    assert moved.format == tv_tensors.BoundingBoxFormat.XYXY
    assert type(out[0][0]) is tv_tensors.Image and type(out[1][0]["masks"]) is tv_tensors.Mask
