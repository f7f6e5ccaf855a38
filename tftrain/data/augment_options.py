"""`data.augment`: the checked, resolved form of the config's augmentation mapping.

No TensorFlow here: `tftrain.config` checks the mapping before TensorFlow starts, and the
reader's augment stage (`tftrain.data.augment`) reads the resolved `Augment`.
"""
from __future__ import annotations

import dataclasses
import difflib
import math

from tftrain.errors import ConfigError

# Model Garden's and timm's defaults (official/vision/configs/common.py, timm's Mixup).
CROP_DEFAULTS = {"scale": (0.08, 1.0), "ratio": (0.75, 4 / 3), "eval_crop": 0.875}
RANDAUGMENT_DEFAULTS = {"num_layers": 2, "magnitude": 10}
MAX_LAYERS, MAX_MAGNITUDE = 10, 30
KEYS = ("random_resized_crop", "flip", "randaugment", "random_erasing", "mixup_alpha",
        "cutmix_alpha", "switch_prob", "mix_prob")


@dataclasses.dataclass(frozen=True)
class Augment:
    """What the training input does to each batch (`data.augment`), every option resolved.

    `crop` is None without `random_resized_crop`, else `{scale, ratio, eval_crop}`;
    `randaugment` None or `{num_layers, magnitude}`."""

    crop: dict | None = None
    flip: bool = False
    randaugment: dict | None = None
    random_erasing: float = 0.0
    mixup_alpha: float = 0.0
    cutmix_alpha: float = 0.0
    switch_prob: float = 0.5
    mix_prob: float = 1.0

    @property
    def mixes(self) -> bool:
        """Whether batches are mixed (mixup or cutmix): labels become soft targets."""
        return self.mixup_alpha > 0 or self.cutmix_alpha > 0

    @property
    def active(self) -> bool:
        """Whether anything is done to the training input at all."""
        return bool(self.crop or self.flip or self.randaugment or self.random_erasing
                    or self.mixes)

    def decode_info(self, info: dict) -> dict:
        """The manifest's `info` as every non-training decode of the data receives it: with
        `random_resized_crop`, `eval_crop` (the square center crop's fraction of the shorter
        side, `pipelines.images.decode_image_batch`), so validation, test, export and predict
        all see what the model was validated on; else `info` itself."""
        return {**info, "eval_crop": self.crop["eval_crop"]} if self.crop else info


def parse(mapping: dict | None, key: str = "data.augment") -> Augment:
    """The `Augment` of a `data.augment` mapping ({} or None: nothing). Raises ConfigError,
    in one line naming `key`, for an unknown augmentation or option and for a value out of
    its range."""
    mapping = dict(mapping or {})
    _known(mapping, KEYS, key)
    crop = _crop(mapping.get("random_resized_crop", False), f"{key}.random_resized_crop")
    flip = mapping.get("flip", False)
    if not isinstance(flip, bool):
        raise ConfigError(f"{key}.flip must be true or false, got {flip!r}")
    return Augment(
        crop=crop, flip=flip,
        randaugment=_randaugment(mapping.get("randaugment"), f"{key}.randaugment"),
        random_erasing=_number(mapping.get("random_erasing", 0.0), f"{key}.random_erasing", 0, 1),
        mixup_alpha=_number(mapping.get("mixup_alpha", 0.0), f"{key}.mixup_alpha", 0, math.inf),
        cutmix_alpha=_number(mapping.get("cutmix_alpha", 0.0), f"{key}.cutmix_alpha", 0,
                             math.inf),
        switch_prob=_number(mapping.get("switch_prob", 0.5), f"{key}.switch_prob", 0, 1),
        mix_prob=_number(mapping.get("mix_prob", 1.0), f"{key}.mix_prob", 0, 1))


def check_task(options: Augment, task_type: str, why: str = "") -> None:
    """Mixing needs classes: ConfigError for mixup/cutmix on a regression or language model
    (`why`: how the type was found, e.g. " (from the dataset's label)")."""
    if options.mixes and task_type in ("regression", "language_model"):
        raise ConfigError(f"data.augment's mixup_alpha/cutmix_alpha mix class labels into soft "
                          f"targets, and task.type={task_type}{why} has no classes to mix: set "
                          "them to 0")


def _known(mapping: dict, valid: tuple, key: str) -> None:
    for name in mapping:
        if name not in valid:
            close = difflib.get_close_matches(str(name), valid, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ConfigError(f"{key} has no option {name!r}: {hint}valid: {', '.join(valid)}")


def _number(value, key: str, low: float, high: float) -> float:
    """`value` as a float in [low, high]; ConfigError otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            low <= value <= high):
        bound = f">= {low:g}" if high == math.inf else f"in [{low:g}, {high:g}]"
        raise ConfigError(f"{key} must be a number {bound}, got {value!r}")
    return float(value)


def _pair(value, key: str) -> tuple[float, float]:
    if (not isinstance(value, (list, tuple)) or len(value) != 2
            or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in value)):
        raise ConfigError(f"{key} must be a pair [low, high] of numbers, got {value!r}")
    low, high = (float(v) for v in value)
    if low > high:
        raise ConfigError(f"{key}={list(value)}: low must be <= high")
    return low, high


def _crop(value, key: str) -> dict | None:
    if value is False or value is None:
        return None
    if value is True:
        value = {}
    if not isinstance(value, dict):
        raise ConfigError(f"{key} must be true, false or a mapping with "
                          f"{', '.join(CROP_DEFAULTS)}, got {value!r}")
    _known(value, tuple(CROP_DEFAULTS), key)
    scale = _pair(value.get("scale", CROP_DEFAULTS["scale"]), f"{key}.scale")
    if not 0 < scale[0] <= scale[1] <= 1:
        raise ConfigError(f"{key}.scale={list(scale)} must lie in (0, 1]: the fractions of the "
                          "image's area a crop may cover")
    ratio = _pair(value.get("ratio", CROP_DEFAULTS["ratio"]), f"{key}.ratio")
    if ratio[0] <= 0:
        raise ConfigError(f"{key}.ratio={list(ratio)} must be > 0 (width / height of a crop)")
    eval_crop = value.get("eval_crop", CROP_DEFAULTS["eval_crop"])
    if isinstance(eval_crop, bool) or not isinstance(eval_crop, (int, float)) or not (
            0 < eval_crop <= 1):
        raise ConfigError(f"{key}.eval_crop must be a number in (0, 1] (the center crop's share "
                          f"of the shorter side at evaluation), got {eval_crop!r}")
    return {"scale": scale, "ratio": ratio, "eval_crop": float(eval_crop)}


def _randaugment(value, key: str) -> dict | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ConfigError(f"{key} must be a mapping {{num_layers: N, magnitude: M}} ({{}}: "
                          f"{RANDAUGMENT_DEFAULTS['num_layers']} layers of magnitude "
                          f"{RANDAUGMENT_DEFAULTS['magnitude']}), got {value!r}")
    _known(value, tuple(RANDAUGMENT_DEFAULTS), key)
    layers = value.get("num_layers", RANDAUGMENT_DEFAULTS["num_layers"])
    if isinstance(layers, bool) or not isinstance(layers, int) or not 0 <= layers <= MAX_LAYERS:
        raise ConfigError(f"{key}.num_layers must be an integer in [0, {MAX_LAYERS}], got "
                          f"{layers!r}")
    magnitude = _number(value.get("magnitude", RANDAUGMENT_DEFAULTS["magnitude"]),
                        f"{key}.magnitude", 0, MAX_MAGNITUDE)
    return {"num_layers": layers, "magnitude": magnitude}
