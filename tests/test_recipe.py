"""fastpipe.Recipe: the image settings checked once, spelled the same way everywhere, refused in
one place per backend, and the eval geometry identical on the CPU path and in DALI (portrait and
landscape photos, square and non-square sizes)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from fastpipe import Recipe, image_loader
from fastpipe import factory as factory_module
from fastpipe._geometry import centre_box, draw_uniforms, eval_resize, eval_resize_to
from fastpipe.data import ImageDecoder, ImageFolder
from fastpipe.recipe import Policy

HAS_DALI = factory_module._dali_installed()
needs_dali = pytest.mark.skipif(not HAS_DALI, reason="needs the dali extra")


# ------------------------------------------------------------------------------- the object


def test_spellings_are_normalized_once():
    from torchvision.transforms import InterpolationMode

    recipe = Recipe(size=224, interpolation=InterpolationMode.BICUBIC, color_jitter=0.4,
                    mean=torch.tensor([0.5, 0.5, 0.5]), std=[0.25, 0.25, 0.25])
    assert recipe.size == (224, 224) and recipe.square
    assert recipe.interpolation == "bicubic"
    assert recipe.color_jitter == (0.4, 0.4, 0.4, 0.0)
    assert recipe.mean == (0.5, 0.5, 0.5) and recipe.std == (0.25, 0.25, 0.25)
    assert Recipe(size=(160, 224)).size == (160, 224) and not Recipe(size=(160, 224)).square
    assert Recipe(auto_augment="rand-m7-n3-inc1").policy == Policy(
        "rand-m7-n3-inc1", "timm_rand", magnitude=7.0, num_ops=3, increasing=True)
    # Frozen and comparable: the same settings are the same recipe.
    assert Recipe(size=(224, 224)) == Recipe(size=224)
    with pytest.raises(AttributeError):
        recipe.size = 64  # type: ignore[misc]


@pytest.mark.parametrize("kwargs, error, message", [
    ({"size": 0}, ValueError, "size"),
    ({"size": (224, 0)}, ValueError, "size"),
    ({"scale": (0.5, 1.5)}, ValueError, "at most 1"),
    ({"ratio": (2.0, 1.0)}, ValueError, "ratio"),
    ({"hflip": 1.5}, ValueError, "hflip"),
    ({"hflip": True}, TypeError, "hflip"),
    ({"crop_pct": 0}, ValueError, "crop_pct"),
    ({"interpolation": "nearest"}, ValueError, "interpolation"),
    ({"auto_augment": "rand-m9-x3"}, ValueError, "section 'x3'"),
    ({"auto_augment": 9}, TypeError, "auto_augment must be"),
    ({"mean": (0.5, 0.5, 0.5)}, ValueError, "both mean and std"),
    ({"mean": (0.5, 0.5), "std": (1.0, 1.0)}, ValueError, "3 values"),
    ({"mean": (0.5, 0.5, 0.5), "std": (1.0, 0.0, 1.0)}, ValueError, "std positive"),
    ({"mean": "0.5", "std": "0.2"}, TypeError, "mean must be a sequence"),
    ({"dtype": torch.int32}, ValueError, "dtype"),
    ({"dtype": torch.uint8, "mean": (0.5,) * 3, "std": (0.2,) * 3}, ValueError, "uint8"),
    ({"train": 1}, TypeError, "train must be True or False"),
    ({"channels_last": "yes"}, TypeError, "channels_last"),
    ({"color_jitter": (0.4, 0.4, 0.4, 0.6)}, ValueError, "hue <= 0.5"),
    ({"cutout_holes": -1}, ValueError, "cutout_holes"),
    ({"train": False, "auto_augment": "ra"}, ValueError, "augmentation is for training"),
    ({"train": False, "cutout_holes": 2}, ValueError, "augmentation is for training"),
    # non-finite and absurd geometry, which reached C++'s crop arithmetic (issue 30)
    ({"scale": (0.08, float("inf"))}, ValueError, "scale"),
    ({"scale": (float("nan"), 1.0)}, ValueError, "scale"),
    ({"ratio": (1e-300, 1.0)}, ValueError, r"ratio \(width:height\) must lie in \[0.001, 1000"),
    ({"ratio": (1.0, 1e300)}, ValueError, r"ratio \(width:height\) must lie in"),
    ({"ratio": (0.75, float("inf"))}, ValueError, "ratio"),
    ({"size": 10**6}, ValueError, "at most 65535 pixels"),
    ({"size": (224, 2**40)}, ValueError, "at most 65535 pixels"),
    ({"crop_pct": 1e-9}, ValueError, r"crop_pct must be in \[0.01, 1\]"),
])
def test_a_bad_setting_is_refused_naming_it(kwargs, error, message):
    with pytest.raises(error, match=message):
        Recipe(**kwargs)


def test_per_sample_keeps_what_a_dataset_applies():
    recipe = Recipe(train=False, size=(160, 224), crop_pct=0.9, interpolation="bicubic",
                    mean=(0.5,) * 3, std=(0.2,) * 3, dtype=torch.float16, channels_last=True)
    part = recipe.per_sample()
    assert (part.train, part.size, part.crop_pct, part.interpolation) == (
        False, (160, 224), 0.9, "bicubic")
    assert (part.mean, part.std, part.dtype, part.channels_last) == (None, None, torch.uint8, False)


# ----------------------------------------------------------- one object, several spellings


def test_keywords_and_a_recipe_build_the_same_thing(sample_root):
    recipe = Recipe(train=False, size=(48, 64), crop_pct=0.9, interpolation="bicubic")
    by_keywords = ImageFolder(sample_root, train=False, size=(48, 64), crop_pct=0.9,
                              interpolation="bicubic", seed=0)
    by_recipe = ImageFolder(sample_root, recipe=recipe, seed=0)
    assert by_keywords.recipe == by_recipe.recipe == recipe
    assert by_keywords.decoder.recipe == recipe
    for index in (0, 5, 17):
        assert torch.equal(by_keywords[index][0], by_recipe[index][0])
    assert ImageDecoder(train=False, size=(48, 64), crop_pct=0.9,
                        interpolation="bicubic").recipe == recipe


def test_a_keyword_that_contradicts_the_recipe_is_refused(sample_root):
    recipe = Recipe(size=64)
    with pytest.raises(ValueError, match="recipe= and size=32"):
        ImageFolder(sample_root, size=32, recipe=recipe)
    with pytest.raises(ValueError, match="recipe= and hflip=0.0"):
        ImageDecoder(hflip=0.0, recipe=recipe)
    with pytest.raises(ValueError, match="recipe= and mean="):
        image_loader(sample_root, 4, mean=(0.1, 0.2, 0.3), std=(1.0, 1.0, 1.0),
                     recipe=recipe.replace(mean=(0.5,) * 3, std=(0.2,) * 3), device="cpu")
    with pytest.raises(TypeError, match="recipe must be a fastpipe.Recipe"):
        ImageFolder(sample_root, recipe={"size": 64})
    # A keyword that says what the recipe says is no contradiction.
    assert ImageFolder(sample_root, size=64, recipe=recipe).recipe == recipe


def test_image_loader_needs_train_or_a_recipe(sample_root):
    with pytest.raises(TypeError, match="train=True or train=False"):
        image_loader(sample_root, 4, device="cpu")


def test_image_loader_builds_one_recipe_for_the_cpu_path(sample_root, no_thread_leak):
    recipe = Recipe(train=False, size=(40, 56), mean=(0.5,) * 3, std=(0.25,) * 3,
                    dtype=torch.float16, channels_last=True)
    loader = image_loader(sample_root, 8, recipe=recipe, backend="cpu", device="cpu",
                          num_workers=0)
    try:
        assert loader.dataset.recipe == recipe.per_sample()
        images, labels = next(iter(loader))
    finally:
        loader.close()
    assert images.shape == (8, 3, 40, 56) and images.dtype == torch.float16
    assert images.is_contiguous(memory_format=torch.channels_last)
    keywords = image_loader(sample_root, 8, train=False, size=(40, 56), mean=(0.5,) * 3,
                            std=(0.25,) * 3, dtype=torch.float16, channels_last=True,
                            backend="cpu", device="cpu", num_workers=0)
    try:
        assert torch.equal(next(iter(keywords))[0], images)
    finally:
        keywords.close()


# ------------------------------------------------------------------ refused in one place


@pytest.mark.parametrize("kwargs, message", [
    ({"color_jitter": 0.4}, "color_jitter.*DALI pipelines only.*ColorJitter"),
    ({"cutout_holes": 1}, "cutout_holes=1 runs in DALI pipelines only.*fastpipe.ops.cutout"),
])
def test_what_the_cpu_path_cannot_run_is_refused(sample_root, kwargs, message):
    recipe = Recipe(**kwargs)
    with pytest.raises(ValueError, match=message):
        recipe.check("cpu")
    with pytest.raises(ValueError, match=message):
        ImageFolder(sample_root, recipe=recipe)
    with pytest.raises(ValueError, match=message):
        image_loader(sample_root, 4, recipe=recipe, backend="cpu", device="cpu")


@pytest.mark.parametrize("kwargs, message", [
    ({"auto_augment": "augmix"}, "AugMix is not in nvidia.dali.auto_aug"),
    ({"auto_augment": "rand-m9-mstd0.5-p1"}, "mstd"),
    ({"auto_augment": "rand-m9-mmax10-p1"}, "not 'mmax10'"),
    ({"auto_augment": "rand-m12-p1"}, "m must be an int in 0-10"),
    ({"auto_augment": "rand-m9-n2-inc1"}, "probability 0.5.*add '-p1'"),
    ({"dtype": torch.bfloat16}, "bfloat16"),
])
def test_what_dali_cannot_run_is_refused(kwargs, message):
    recipe = Recipe(**kwargs)
    recipe.check("cpu")  # the CPU path runs each of them
    with pytest.raises(ValueError, match=message):
        recipe.check("dali")


@needs_dali
def test_dali_refuses_at_construction(sample_root):
    from fastpipe.dali import DALILoader, image_pipeline

    with pytest.raises(ValueError, match="probability 0.5"):
        DALILoader(sample_root, batch_size=4, device="cpu", auto_augment="rand-m9-n2-inc1")
    with pytest.raises(ValueError, match="AugMix"):
        image_pipeline(sample_root, batch_size=4, device="cpu",
                       recipe=Recipe(auto_augment="augmix"))
    with pytest.raises(ValueError, match="bfloat16"):
        image_loader(sample_root, 4, train=True, dtype=torch.bfloat16, backend="dali",
                     device="cpu")


def test_auto_runs_what_dali_cannot_on_the_cpu_path(monkeypatch, sample_root):
    """With CUDA and DALI (stand-ins here), 'auto' picks DALI, except for a recipe DALI cannot
    run, which the CPU path runs instead of failing."""
    chosen = []
    monkeypatch.setattr(factory_module, "_dali_installed", lambda: True)
    monkeypatch.setattr(factory_module, "_dali_sees_a_gpu", lambda: True)
    monkeypatch.setattr(factory_module, "resolve_device",
                        lambda device, where: torch.device("cuda"))
    monkeypatch.setattr(factory_module, "_build_dali", lambda o: chosen.append("dali"))
    monkeypatch.setattr(factory_module, "_build_cpu", lambda o: chosen.append("cpu"))
    image_loader(sample_root, 4, train=True, auto_augment="ra")
    image_loader(sample_root, 4, train=True, auto_augment="augmix")
    assert chosen == ["dali", "cpu"]


# ---------------------------------------------------------------------------- the geometry


def test_eval_geometry_is_torchvisions_resize_and_centre_crop():
    from torchvision.transforms.v2 import functional as F

    rng = random.Random(0)
    for _ in range(300):
        height, width, side = rng.randint(1, 3000), rng.randint(1, 3000), rng.randint(1, 600)
        expected = (side, int(side * width / height)) if height <= width else (
            int(side * height / width), side)
        assert eval_resize(height, width, side) == expected
        extra_h, extra_w = rng.randint(0, 999), rng.randint(0, 999)
        box = centre_box(100 + extra_h, 100 + extra_w, 100)
        assert (box.top, box.left) == (int(round(extra_h / 2)), int(round(extra_w / 2)))
    # The sizes torchvision itself gives, on real tensors.
    for height, width in ((37, 91), (91, 37), (50, 50), (333, 500)):
        image = torch.zeros(1, height, width, dtype=torch.uint8)
        resized = F.resize(image, 24, antialias=True)
        assert tuple(resized.shape[-2:]) == eval_resize(height, width, 24)
    assert eval_resize_to((224, 224), 0.875) == 256
    assert eval_resize_to((160, 224), 0.875) == (182, 256)
    assert eval_resize_to((190, 190), 0.95) == 200  # not 199: the quotient is 200


# ----------------------------------------------------- the same crop on both backends


@pytest.fixture(scope="module")
def oriented_root(tmp_path_factory) -> Path:
    """Photo-like JPEGs (the sample set's scenes), each as landscape and as portrait."""
    from PIL import Image

    from fastpipe.data import sample_images

    scenes = sample_images(tmp_path_factory.mktemp("scenes") / "s", num_images=8, num_classes=1)
    root = tmp_path_factory.mktemp("oriented")
    for kind in ("landscape", "portrait"):
        (root / kind).mkdir()
    for i, path in enumerate(sorted(scenes.rglob("*.jpg"))):
        with Image.open(path) as image:
            image.save(root / "landscape" / f"{i}.jpg", quality=90)
            image.transpose(Image.Transpose.ROTATE_90).save(root / "portrait" / f"{i}.jpg",
                                                             quality=90)
    return root


def _first_batch(root: Path, backend: str, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    loader = image_loader(root, 16, backend=backend, device="cpu", num_workers=2, shuffle=False,
                          dtype=torch.uint8, mean=None, std=None, **kwargs)
    try:
        images, labels = next(iter(loader))
    finally:
        loader.close()
    return images.float() / 255, labels


@needs_dali
@pytest.mark.parametrize("size", [(160, 224), (224, 160), 96])
@pytest.mark.slow
def test_eval_batches_agree_across_backends_on_portrait_and_landscape(oriented_root, size,
                                                                      no_thread_leak):
    cpu, cpu_labels = _first_batch(oriented_root, "cpu", train=False, size=size)
    dali, dali_labels = _first_batch(oriented_root, "dali", train=False, size=size)
    expected = (size, size) if isinstance(size, int) else size
    assert cpu.shape == dali.shape == (16, 3, *expected)
    assert torch.equal(cpu_labels, dali_labels) and set(cpu_labels.tolist()) == {0, 1}
    # Different JPEG decoders and resize filters: close, not equal (the CPU path decodes at a
    # reduced DCT scale when the image is twice the output or more). The same rectangle: a crop
    # one pixel off moves these photos by more than neighbouring columns differ.
    difference = (cpu - dali).abs().mean(dim=(1, 2, 3))
    one_column = (cpu[..., 1:] - cpu[..., :-1]).abs().mean(dim=(1, 2, 3))
    assert float(difference.max()) < 0.01, difference
    assert bool((difference < one_column / 3).all()), (difference, one_column)


@needs_dali
@pytest.mark.parametrize("size", [(160, 224), 96])
def test_train_whole_image_crops_agree_across_backends(oriented_root, size, no_thread_leak):
    """A train recipe whose crop is always the whole image (area 1, any aspect ratio, no flip):
    the random draws cannot differ, so the two backends resize the same pixels."""
    # Seeded: an aspect draw within a pixel of the image's own gives a crop a pixel short, and
    # these seeds draw none.
    whole = {"train": True, "size": size, "scale": (1.0, 1.0), "ratio": (0.01, 100.0),
             "hflip": 0.0, "seed": 0}
    cpu, cpu_labels = _first_batch(oriented_root, "cpu", **whole)
    dali, dali_labels = _first_batch(oriented_root, "dali", **whole)
    assert torch.equal(cpu_labels, dali_labels)
    difference = (cpu - dali).abs().mean(dim=(1, 2, 3))
    colour = (cpu.mean(dim=(2, 3)) - dali.mean(dim=(2, 3))).abs()
    # Train decodes at the smallest DCT scale that still covers the output, with replicated
    # chroma: further from DALI's full decode than eval, still well under a flipped or
    # shifted image.
    assert float(difference.max()) < 0.04, difference
    assert float(colour.max()) < 0.005, colour


# ----------------------------------------------------- the draw GPU decode receives


def test_the_draw_is_the_cpu_decoders_plan_for_every_seed():
    """Recipe.draw is the geometry ImageDecoder crops: the same box and flip for a seed (train)
    and the same resize and centre crop (eval), at every image size and aspect."""
    from fastpipe.data.sampling.seeds import reseeded

    for recipe in (Recipe(train=True, size=(160, 96), scale=(0.05, 1.0)),
                   Recipe(train=False, size=224), Recipe(train=False, size=(160, 96))):
        decoder = ImageDecoder(recipe=recipe)
        for seed, (h, w) in enumerate([(480, 640), (640, 480), (37, 2000), (224, 224), (5, 9)]):
            plan = decoder._plan(h, w, generator=reseeded(seed))
            uniforms = draw_uniforms(reseeded(seed)) if recipe.train else None
            box, resize, flip = recipe.draw(h, w, uniforms)
            assert (plan.box, plan.resize, plan.flip) == (box, resize, flip)


def test_the_draw_flips_as_often_as_hflip_and_never_in_eval():
    from fastpipe.data.sampling.seeds import reseeded

    recipe = Recipe(train=True, hflip=0.3)
    flips = [recipe.draw(100, 100, draw_uniforms(reseeded(s))).flip for s in range(2000)]
    assert 0.25 < sum(flips) / len(flips) < 0.35
    assert not any(Recipe(train=False).draw(100, 120).flip for _ in range(3))
    with pytest.raises(ValueError, match="needs the 23 uniforms"):
        recipe.draw(100, 100)


def test_gpu_decode_refuses_auto_augment_naming_the_fix():
    Recipe(train=True).check("gpu")
    with pytest.raises(ValueError, match="decode='cpu'"):
        Recipe(train=True, auto_augment="ra").check("gpu")
    with pytest.raises(ValueError, match="cutout_holes"):
        Recipe(train=True, cutout_holes=1).check("gpu")
