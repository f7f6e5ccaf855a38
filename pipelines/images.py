"""Image features with the standard TF keys, shared by the image pipelines.

Keys: image/encoded, image/format, image/height, image/width, image/class/label,
image/class/text, image/filename — the layout other TF tooling (TFDS, Model Garden, TF Object
Detection) reads, so the shards interoperate.

How the pixels are stored is the `image_encoding` pipeline option (see `encoding_options`):
`keep` the source's JPEG/PNG bytes, `raw` uint8 pixels at the training size (read without any
decode), `png` or `jpeg` re-encoded at the training size. The manifest's `info` records it, and
`decode_image_batch` reads each accordingly.
"""
from __future__ import annotations

import io
import struct
import zlib

from pipelines import raw_bytes
from pipelines.options import get_int
from tftrain.data import example_bytes
from tftrain.errors import BadRow, ConfigError

# A "default" marks a key that other TF tooling does not always write: a foreign TFRecord
# without it still parses (see `tftrain.data.reader.parse_spec`).
IMAGE_FEATURES = {
    "image/encoded": {"dtype": "string", "shape": []},
    "image/format": {"dtype": "string", "shape": [], "default": ""},
    "image/height": {"dtype": "int64", "shape": [], "default": 0},
    "image/width": {"dtype": "int64", "shape": [], "default": 0},
    "image/class/label": {"dtype": "int64", "shape": []},
    "image/class/text": {"dtype": "string", "shape": [], "default": ""},
    "image/filename": {"dtype": "string", "shape": [], "default": ""},
}


def image_example(*, encoded: bytes, image_format: str, height: int, width: int, label: int,
                  text: str, filename: str) -> bytes:
    """A serialized `tf.train.Example` with the standard image keys."""
    return example_bytes.example({
        "image/encoded": example_bytes.bytes_feature(encoded),
        "image/format": example_bytes.bytes_feature(image_format),
        "image/height": example_bytes.int64_feature(height),
        "image/width": example_bytes.int64_feature(width),
        "image/class/label": example_bytes.int64_feature(label),
        "image/class/text": example_bytes.bytes_feature(text),
        "image/filename": example_bytes.bytes_feature(filename),
    })


def png_example(pixels, *, label: int, text: str, filename: str) -> bytes:
    """A serialized standard-keys `tf.train.Example` holding `pixels` (uint8, HxW or HxWxC) as a PNG."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return image_example(encoded=buffer.getvalue(), image_format="png", height=pixels.shape[0],
                         width=pixels.shape[1], label=label, text=text, filename=filename)


ENCODINGS = ("keep", "raw", "png", "jpeg", "auto")
ENCODING_OPTIONS = ("image_encoding", "jpeg_quality", "max_pixels")
# The largest image (height x width) converted or decoded: a 400 KB PNG can declare 20000x20000
# pixels, 1.6 GB as float32 before resizing. PIL warns from 89 megapixels; a 100-megapixel
# photo still passes. `max_pixels` (a pipeline option, kept in the manifest) changes it.
DEFAULT_MAX_PIXELS = 100_000_000
TOO_MANY_PIXELS = "image over max_pixels"  # in the error of the decode graph
DEFAULT_JPEG_QUALITY = 95
# `auto` stores raw pixels up to this many bytes per image (64x64x3), else keeps the source's
# bytes: measured by bench/image_encoding.py, raw reads 2.5-3.7x faster than PNG at 32x32x3 for
# 2x the bytes, while at 160x160x3 it is 9x the bytes of a JPEG for 1.2-1.8x (docs/pipelines.md).
AUTO_RAW_MAX_BYTES = 64 * 64 * 3


def encoding_options(options: dict, default: str = "keep") -> dict:
    """The checked `image_encoding` and `jpeg_quality` pipeline options.

    Returns `{"image_encoding": name}`, with `"jpeg_quality"` for jpeg; `auto` is resolved later
    by `encoding_info`, once the image size is known. Raises `ConfigError` for an unknown
    encoding, a quality outside 1..100, or a quality without jpeg.
    """
    limit = ({"max_pixels": get_int(options, "max_pixels", DEFAULT_MAX_PIXELS)}
             if "max_pixels" in options else {})
    if limit and limit["max_pixels"] < 1:
        raise ConfigError(f"pipeline option max_pixels={limit['max_pixels']} must be positive.")
    name = str(options.get("image_encoding") or default).strip().lower()
    if name not in ENCODINGS:
        raise ConfigError(f"pipeline option image_encoding={options.get('image_encoding')!r} must be "
                          f"one of {', '.join(ENCODINGS)}.")
    if "jpeg_quality" in options and name != "jpeg":
        raise ConfigError(f"pipeline option jpeg_quality is only used with image_encoding=jpeg "
                          f"(here image_encoding={name}).")
    if name != "jpeg":
        return {"image_encoding": name, **limit}
    quality = get_int(options, "jpeg_quality", DEFAULT_JPEG_QUALITY)
    if not 1 <= quality <= 100:
        raise ConfigError(f"pipeline option jpeg_quality={quality} must be between 1 and 100.")
    return {"image_encoding": name, "jpeg_quality": quality, **limit}


def encoding_info(encoding: dict, image_size) -> dict:
    """`encoding` (from `encoding_options`) with `auto` resolved for images of `image_size`
    ([height, width, channels]): what the manifest's `info` records."""
    if encoding["image_encoding"] != "auto":
        return dict(encoding)
    height, width, channels = image_size
    return {**encoding,
            "image_encoding": "raw" if height * width * channels <= AUTO_RAW_MAX_BYTES else "keep"}


def encoded_image_example(info: dict, *, label: int, text: str, filename: str,
                          data: bytes | None = None, pixels=None,
                          probed: tuple[str, int, int] | None = None) -> bytes:
    """A standard-keys Example of one image, stored as `info["image_encoding"]` says.

    The image is either the source's encoded bytes `data` (checked with `probe_image`, so a
    damaged file is a `BadRow` whatever the encoding; `probed`: its result when the caller has
    it already) or a uint8 array `pixels` (HxW or HxWxC).
    `keep` (also when `info` has no encoding) stores `data` as it is, and `pixels` as a PNG.
    `raw`, `png` and `jpeg` store the pixels with `info["image_size"]`'s channels, resized to its
    height and width (aspect kept and padded with black, like the reader's `resize_with_pad`)
    when the image has another size: `raw` as uint8 bytes in height, width, channel order.
    """
    encoding = info.get("image_encoding", "keep")
    if data is not None:
        image_format, height, width = probed or probe_image(data)
        limit = info.get("max_pixels", DEFAULT_MAX_PIXELS)
        if height * width > limit:  # checked from the header, before any decoding
            raise BadRow(f"{image_format.upper()} of {width}x{height} pixels is over "
                         f"max_pixels={limit:,} (a pipeline option)")
        if encoding == "keep":
            return image_example(encoded=data, image_format=image_format, height=height,
                                 width=width, label=label, text=text, filename=filename)
        image = _decoded(data, image_format)
    elif encoding == "keep":
        return png_example(pixels, label=label, text=text, filename=filename)
    else:
        from PIL import Image

        image = Image.fromarray(pixels[..., 0] if pixels.ndim == 3 and pixels.shape[2] == 1 else pixels)
    image = _at_size(image, *info["image_size"])
    if encoding == "raw":
        encoded = image.tobytes()
    else:
        buffer = io.BytesIO()
        image.save(buffer, format=encoding.upper(),
                   **({"quality": info.get("jpeg_quality", DEFAULT_JPEG_QUALITY)}
                      if encoding == "jpeg" else {}))
        encoded = buffer.getvalue()
    return image_example(encoded=encoded, image_format=encoding, height=image.height,
                         width=image.width, label=label, text=text, filename=filename)


def _decoded(data: bytes, image_format: str):
    """The PIL image of checked JPEG/PNG bytes, its pixels loaded; damage is a BadRow."""
    from PIL import Image

    try:
        image = Image.open(io.BytesIO(data), formats=[image_format.upper()])
        image.load()
    except Exception as e:  # PIL raises OSError, SyntaxError, ... for damaged pixel data
        raise BadRow(f"cannot decode {image_format.upper()}: {type(e).__name__}: {e}") from None
    return image


def _at_size(image, height: int, width: int, channels: int):
    """`image` with `channels` (L or RGB) and fitted into height x width as
    `tf.image.resize_with_pad` fits it (same size and offsets; PIL's bilinear filter)."""
    from PIL import Image

    mode = "L" if channels == 1 else "RGB"
    if image.mode != mode:
        image = image.convert(mode)
    if image.size == (width, height):
        return image
    ratio = max(image.width / width, image.height / height)
    fitted_w, fitted_h = image.width / ratio, image.height / ratio
    resized = image.resize((max(int(fitted_w), 1), max(int(fitted_h), 1)), Image.BILINEAR)
    canvas = Image.new(mode, (width, height))
    canvas.paste(resized, (max(int((width - fitted_w) / 2), 0), max(int((height - fitted_h) / 2), 0)))
    return canvas


def decode_image_batch(features: dict, height: int, width: int, channels: int,
                       info: dict | None = None):
    """Decodes a batch of stored images to float32 in [0, 1], resized to height x width.

    Returns `(images, labels)` with images shaped [batch, height, width, channels] and int32
    labels. `info` (the manifest's) says how the images are stored: raw pixels
    (`image_encoding=raw`, of shape `info["image_size"]`) are one `decode_raw` of the whole
    batch; anything else (JPEG/PNG bytes, or no recorded encoding: older datasets, foreign
    TFRecords) decodes per image (JPEG/PNG are per-image formats) in a vectorized map.

    Without a crop, an image of another size is fitted in with `resize_with_pad`. Two keys of
    `info` crop each image to a window first and resize the window to height x width (no
    padding), decoding only the window of a JPEG (`decode_and_crop_jpeg`):
    `eval_crop` (a fraction: the square center crop of that share of the shorter side, what
    evaluation sees with `data.augment.random_resized_crop`), or `random_crop` (set by the
    reader's augment stage per training batch: `{scale, ratio, seeds}`, see `random_window`).
    """
    import tensorflow as tf

    info = info or {}
    window = _window_function(info)
    if info.get("image_encoding") == "raw":
        return _decode_raw_batch(features, info["image_size"], height, width, channels, info)
    limit = info.get("max_pixels", DEFAULT_MAX_PIXELS)
    # Every image's declared size, read from the headers of the whole batch at once, before
    # anything decodes (one check per batch: per image, the check cost 2.6x a 32x32 PNG's decode).
    within = tf.debugging.assert_less_equal(
        header_pixels(features["image/encoded"]), tf.constant(limit, tf.int64),
        message=f"{TOO_MANY_PIXELS}={limit}: its header declares more pixels")

    def decode(encoded):
        return tf.io.decode_image(encoded, channels=channels, expand_animations=False)

    def decode_batch(decode_one, dtype, elements=None):
        # One image at a time within a batch: the parallel map over batches already keeps the
        # cores busy, and a parallel loop only added hand-offs (bench/input.py: 75 -> 63 us of
        # CPU per 32x32 PNG).
        with tf.control_dependencies([within]):
            return tf.map_fn(decode_one, elements or features["image/encoded"],
                             parallel_iterations=1,
                             fn_output_signature=tf.TensorSpec([height, width, channels], dtype))

    labels = tf.cast(features["image/class/label"], tf.int32)
    if window is not None:
        def decode_window(args):
            cropped = decode_window_of(args[0], lambda size: window(size, args[1]), channels)
            return tf.image.resize(tf.cast(cropped, tf.float32), [height, width])

        seeds = info.get("random_crop", {}).get("seeds")
        if seeds is None:  # the same (center) window rule for every image
            seeds = tf.zeros([tf.shape(features["image/encoded"])[0], 2], tf.int64)
        images = decode_batch(decode_window, tf.float32, (features["image/encoded"], seeds))
        return images / 255.0, labels

    # Datasets are usually stored at the training size: then the (costly) resize is skipped for
    # the whole batch, decided from the stored image/height and image/width, and the images stay
    # uint8 until one cast of the whole batch (a cast per image costs more).
    stored_at_size = tf.reduce_all(tf.logical_and(
        tf.equal(features["image/height"], height), tf.equal(features["image/width"], width)))
    images = tf.cond(
        stored_at_size,
        lambda: tf.cast(decode_batch(
            lambda e: tf.ensure_shape(decode(e), [height, width, channels]), tf.uint8), tf.float32),
        lambda: decode_batch(
            lambda e: tf.image.resize_with_pad(tf.cast(decode(e), tf.float32), height, width),
            tf.float32))
    return images / 255.0, labels


def decode_window_of(encoded, window, channels: int):
    """One encoded image's pixels (uint8) inside `window(size)`'s `(top, left, height, width)`
    for its [height, width] `size`: a JPEG decodes only that window (its size read from its
    header), other formats decode whole and are cut."""
    import tensorflow as tf

    def jpeg():
        return tf.image.decode_and_crop_jpeg(
            encoded, tf.stack(window(tf.image.extract_jpeg_shape(encoded)[:2])),
            channels=channels)

    def other():
        image = tf.io.decode_image(encoded, channels=channels, expand_animations=False)
        top, left, rows, columns = window(tf.shape(image)[:2])
        return image[top:top + rows, left:left + columns]

    return tf.cond(tf.equal(tf.strings.substr(encoded, 0, 2), b"\xff\xd8"), jpeg, other)


def center_window(size, fraction: float):
    """`(top, left, height, width)` of the square center crop of `fraction` of the shorter side
    of an image of [height, width] `size` (Model Garden's `center_crop_image`)."""
    import tensorflow as tf

    size = tf.cast(size, tf.int32)
    side = tf.maximum(tf.cast(fraction * tf.cast(tf.reduce_min(size), tf.float32), tf.int32), 1)
    return [(size[0] - side + 1) // 2, (size[1] - side + 1) // 2, side, side]


def random_window(size, seed, scale, ratio):
    """`(top, left, height, width)` of an Inception-style random crop of an image of
    [height, width] `size`, drawn statelessly from `seed` ([2] integers): area a fraction in
    `scale` of the image's, aspect (width / height) in `ratio`, the whole image when 10
    attempts found none (`stateless_sample_distorted_bounding_box`)."""
    import tensorflow as tf

    size = tf.cast(size, tf.int32)
    begin, extent, _ = tf.image.stateless_sample_distorted_bounding_box(
        tf.concat([size, [1]], 0), tf.constant([[[0.0, 0.0, 1.0, 1.0]]]), seed=seed,
        min_object_covered=0.1, aspect_ratio_range=list(ratio), area_range=list(scale),
        max_attempts=10, use_image_if_no_bounding_boxes=True)
    return [begin[0], begin[1], extent[0], extent[1]]


def random_crop_batch(images, seeds, scale, ratio, height: int, width: int):
    """Each image of a decoded batch [B, H, W, C] cut to its `random_window` (seeds [B, 2]) and
    resized to height x width, in one `crop_and_resize` of the whole batch."""
    import tensorflow as tf

    size = tf.shape(images)[1:3]
    windows = tf.map_fn(lambda seed: tf.stack(random_window(size, seed, scale, ratio)), seeds,
                        fn_output_signature=tf.TensorSpec([4], tf.int32))
    last = tf.cast(tf.maximum(size - 1, 1), tf.float32)
    first = tf.cast(windows[:, :2], tf.float32)
    boxes = tf.concat([first / last, (first + tf.cast(windows[:, 2:] - 1, tf.float32)) / last], 1)
    return tf.image.crop_and_resize(images, boxes, tf.range(tf.shape(images)[0]),
                                    [height, width])


def _window_function(info: dict):
    """`window(size, seed)` for the crop `info` asks for (`decode_image_batch`), or None."""
    if "random_crop" in info:
        crop = info["random_crop"]
        return lambda size, seed: random_window(size, seed, crop["scale"], crop["ratio"])
    if info.get("eval_crop"):
        return lambda size, seed: center_window(size, info["eval_crop"])
    return None


def header_pixels(encoded):
    """Height x width (int64, one per image) that a batch of encoded PNG, JPEG, GIF or BMP
    images declare in their headers, read in the graph without decoding (0 for other content,
    which `decode_image` then refuses). Vectorized over the batch; only a batch holding JPEGs
    parses their headers one at a time (their size sits after a variable run of segments)."""
    import tensorflow as tf

    padded = tf.strings.join([tf.strings.substr(encoded, 0, 26), tf.constant(b"\0" * 26)])
    head = tf.cast(tf.io.decode_raw(tf.strings.substr(padded, 0, 26), tf.uint8), tf.int64)

    def number(start, size, big_endian):
        places = range(size) if big_endian else range(size - 1, -1, -1)
        value = tf.zeros_like(head[:, 0])
        for i in places:
            value = value * 256 + head[:, start + i]
        return value

    def unsigned_magnitude(value):  # |int32| of an unsigned reading (BMP: negative = top-down)
        return tf.where(value >= 2**31, 2**32 - value, value)

    def starts_with(prefix: bytes):
        return tf.equal(tf.strings.substr(padded, 0, len(prefix)), prefix)

    is_jpeg = starts_with(b"\xff\xd8")

    def jpeg_pixels():  # the other images stand in as a 1x1 JPEG (their result is not used)
        shapes = tf.map_fn(tf.image.extract_jpeg_shape, tf.where(is_jpeg, encoded, _TINY_JPEG),
                           fn_output_signature=tf.int32)
        return tf.cast(shapes[:, 0], tf.int64) * tf.cast(shapes[:, 1], tf.int64)

    pixels = tf.where(starts_with(_PNG_MAGIC), number(16, 4, True) * number(20, 4, True), 0)
    pixels = tf.where(starts_with(b"GIF"), number(6, 2, False) * number(8, 2, False), pixels)
    pixels = tf.where(starts_with(b"BM"),
                      number(18, 4, False) * unsigned_magnitude(number(22, 4, False)), pixels)
    return tf.cond(tf.reduce_any(is_jpeg), lambda: tf.where(is_jpeg, jpeg_pixels(), pixels),
                   lambda: pixels)


def _decode_raw_batch(features: dict, stored, height: int, width: int, channels: int,
                      info: dict):
    """Raw uint8 pixels of the `stored` [height, width, channels] -> the decoded batch, with the
    same ops as the JPEG/PNG path on images stored at size (so the values are identical); the
    crops of `info` (see `decode_image_batch`) cut the whole batch at once."""
    import tensorflow as tf

    stored_height, stored_width, stored_channels = stored
    images = raw_bytes.decode_batch(
        features["image/encoded"], tf.uint8, stored, "image_encoding=raw image",
        f"image_size {stored_height}x{stored_width}x{stored_channels}")
    images = tf.cast(images, tf.float32)
    if stored_channels != channels:  # read with other channels than converted: rare, vectorized
        images = (tf.image.grayscale_to_rgb(images) if channels == 3
                  else tf.round(tf.image.rgb_to_grayscale(images)))
    labels = tf.cast(features["image/class/label"], tf.int32)
    if "random_crop" in info:
        crop = info["random_crop"]
        images = random_crop_batch(images, crop["seeds"], crop["scale"], crop["ratio"], height,
                                   width)
        return images / 255.0, labels
    if info.get("eval_crop"):
        top, left, rows, columns = center_window([stored_height, stored_width],
                                                 info["eval_crop"])
        images = tf.image.resize(images[:, top:top + rows, left:left + columns], [height, width])
    elif (stored_height, stored_width) != (height, width):
        images = tf.image.resize_with_pad(images, height, width)
    return images / 255.0, labels


_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# A 1x1 grayscale JPEG: what `header_pixels` parses in place of the non-JPEGs of a mixed batch.
_TINY_JPEG = bytes.fromhex(
    "ffd8ffdb004300080606070605080707070909080a0c140d0c0b0b0c1912130f141d1a1f1e1d1a1c1c20242e2720"
    "222c231c1c2837292c30313434341f27393d38323c2e333432ffc0000b080001000101011100ffc4001f000001"
    "0501010101010100000000000000000102030405060708090a0bffc400b5100002010303020403050504040000"
    "017d01020300041105122131410613516107227114328191a1082342b1c11552d1f02433627282090a161718191a"
    "25262728292a3435363738393a434445464748494a535455565758595a636465666768696a737475767778797a83"
    "8485868788898a92939495969798999aa2a3a4a5a6a7a8a9aab2b3b4b5b6b7b8b9bac2c3c4c5c6c7c8c9cad2d3d4"
    "d5d6d7d8d9dae1e2e3e4e5e6e7e8e9eaf1f2f3f4f5f6f7f8f9faffda0008010100003f00fbd3ffd9")
_JPEG_STANDALONE = {0x01, *range(0xD0, 0xD8)}  # markers without a length field (TEM, RSTn)


def _jpeg_check(data: bytes) -> None:
    """Walks a JPEG's segments up to the first scan and checks an end-of-image marker follows.

    Entropy-coded data cannot contain 0xFFD9 (0xFF is byte-stuffed), so a JPEG whose bytes stop
    early has no EOI after its first scan. Bytes after the EOI (camera trailers) are allowed.
    """
    pos = 2
    while True:
        while pos < len(data) and data[pos] == 0xFF:  # fill bytes before a marker
            pos += 1
        if pos >= len(data) or data[pos - 1] != 0xFF:
            raise BadRow(f"truncated or corrupt JPEG: no valid marker at byte {pos}")
        marker = data[pos]
        pos += 1
        if marker in _JPEG_STANDALONE:
            continue
        if marker == 0xD9:
            raise BadRow("corrupt JPEG: end of image before any scan")
        if pos + 2 > len(data):
            raise BadRow(f"truncated JPEG: file ends at byte {len(data)} inside a segment header")
        pos += int.from_bytes(data[pos:pos + 2], "big")
        if pos > len(data):
            raise BadRow(f"truncated JPEG: segment 0xFF{marker:02X} runs past the end of the file "
                         f"({len(data)} bytes)")
        if marker == 0xDA:  # start of scan: the compressed image data follows
            break
    if data.find(b"\xff\xd9", pos) < 0:
        raise BadRow(f"truncated JPEG: no end-of-image marker after the image data ({len(data)} bytes)")


def _png_check(data: bytes) -> tuple[int, int]:
    """Walks a PNG's chunks up to IEND, checking each CRC; returns (height, width) from IHDR.

    The same checks as PIL's `verify()`, without building an image object (which costs more than
    the check itself for small images).
    """
    view, pos, size, chunk_types = memoryview(data), 8, None, []
    while True:
        if pos + 12 > len(data):
            raise BadRow(f"truncated or corrupt PNG: it ends at byte {len(data)} before its IEND chunk")
        length, chunk_type = struct.unpack_from(">I4s", data, pos)
        end = pos + 12 + length
        if end > len(data):
            raise BadRow(f"truncated or corrupt PNG: its {chunk_type!r} chunk at byte {pos} needs "
                         f"{end} bytes, the file has {len(data)}")
        (crc,) = struct.unpack_from(">I", data, end - 4)
        if zlib.crc32(view[pos + 4:end - 4]) != crc:
            raise BadRow(f"corrupt PNG: CRC mismatch in its {chunk_type!r} chunk at byte {pos}")
        if not chunk_types and chunk_type != b"IHDR":
            raise BadRow("corrupt PNG: the first chunk is not IHDR")
        if chunk_type == b"IHDR":
            width, height = struct.unpack_from(">II", data, pos + 8)
            size = (height, width)
        chunk_types.append(chunk_type)
        if chunk_type == b"IEND":
            break
        pos = end
    if b"IDAT" not in chunk_types:
        raise BadRow("corrupt PNG: no image data (IDAT) chunk")
    return size


def probe_image(data: bytes) -> tuple[str, int, int]:
    """Returns `(format, height, width)` of an encoded JPEG or PNG without decoding its pixels.

    Checks enough structure to catch the usual damage: PNG chunk CRCs up to IEND, JPEG segment
    lengths and the end-of-image marker. Raises `tftrain.errors.BadRow` naming the problem for an
    empty file, a file that is not an image, another image format, or a truncated image.
    """
    if not data:
        raise BadRow("empty file")
    if data.startswith(_PNG_MAGIC):
        image_format = "png"
    elif data.startswith(b"\xff\xd8"):
        image_format = "jpeg"
    else:
        import PIL.Image

        try:
            with PIL.Image.open(io.BytesIO(data)) as image:
                found = image.format
        except Exception:  # PIL raises several types for unknown content
            raise BadRow(f"not an image: unknown content starting with {data[:8]!r}") from None
        raise BadRow(f"unsupported image format {found} (only JPEG and PNG are kept as they are)")
    if image_format == "png":
        height, width = _png_check(data)
        if width <= 0 or height <= 0:
            raise BadRow(f"PNG has an empty size {width}x{height}")
        return image_format, height, width
    import PIL.Image

    try:
        with PIL.Image.open(io.BytesIO(data), formats=[image_format.upper()]) as image:
            width, height = image.size
    except PIL.UnidentifiedImageError:
        raise BadRow(f"truncated or corrupt {image_format.upper()}: its header cannot be read "
                     f"({len(data)} bytes)") from None
    except Exception as e:  # truncated/corrupt headers surface as OSError, SyntaxError, struct.error...
        raise BadRow(f"truncated or corrupt {image_format.upper()}: {type(e).__name__}: {e}") from None
    if image_format == "jpeg":
        _jpeg_check(data)
    if width <= 0 or height <= 0:
        raise BadRow(f"{image_format.upper()} has an empty size {width}x{height}")
    return image_format, height, width
