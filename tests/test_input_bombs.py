"""Small inputs that would take unbounded memory, and rows that were lost silently or crashed a
conversion, are stopped early with one line (issue #23, defects 4, 5 and 6)."""
from __future__ import annotations

import io
import json
import struct
import zlib

import pytest
import tensorflow as tf
from PIL import Image

from pipelines import images
from tests.test_output_ownership import one_error_line
from tests.test_pipeline_image_folder import COLORS, make_folder
from tftrain import config as config_lib
from tftrain.data import reader
from tftrain.errors import ConfigError


def png_bomb(width=20_000, height=20_000) -> bytes:
    """An all-black grayscale PNG of width x height, streamed through zlib (a few hundred KB)."""
    def chunk(kind, data):
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data)))

    packer, row, parts = zlib.compressobj(9), b"\0" * (width + 1), []
    for _ in range(height):
        parts.append(packer.compress(row))
    parts.append(packer.flush())
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (images._PNG_MAGIC + chunk(b"IHDR", ihdr) + chunk(b"IDAT", b"".join(parts))
            + chunk(b"IEND", b""))


@pytest.fixture(scope="module")
def bomb():
    data = png_bomb()
    assert len(data) < 1_000_000
    return data


def test_a_png_bomb_is_a_bad_row_at_conversion(bomb, tmp_path, cli, capsys):
    make_folder(tmp_path / "photos", per_class=40)
    (tmp_path / "photos" / next(iter(COLORS)) / "bomb.png").write_bytes(bomb)
    assert cli("convert", "--pipeline=image_folder", f"--input={tmp_path / 'photos'}",
               f"--output={tmp_path / 'ds'}", "--max_bad_fraction=0.05") == 0
    bad = [json.loads(line) for line in (tmp_path / "ds" / "bad_rows.jsonl").read_text().splitlines()]
    assert len(bad) == 1 and "20000x20000 pixels is over max_pixels=100,000,000" in bad[0]["reason"]


@pytest.mark.parametrize("fmt, size", [("PNG", (37, 11)), ("JPEG", (40, 30)), ("GIF", (9, 7)),
                                       ("BMP", (13, 5))])
def test_header_pixels_reads_the_size_without_decoding(fmt, size):
    buffer = io.BytesIO()
    Image.new("RGB", size).save(buffer, format=fmt)
    other = io.BytesIO()
    Image.new("RGB", (3, 2)).save(other, format="PNG")
    pixels = images.header_pixels(tf.constant([buffer.getvalue(), other.getvalue(), b"text"]))
    assert pixels.numpy().tolist() == [size[0] * size[1], 6, 0]


def test_the_decode_graph_refuses_a_bomb_before_decoding_it(bomb):
    features = {"image/encoded": tf.constant([bomb]), "image/height": tf.constant([8], tf.int64),
                "image/width": tf.constant([8], tf.int64),
                "image/class/label": tf.constant([0], tf.int64)}
    with pytest.raises(tf.errors.InvalidArgumentError) as raised:
        images.decode_image_batch(features, 8, 8, 1, {"image_encoding": "keep"})
    line = reader.damaged_record_message(raised.value)
    assert line and "declares more than max_pixels=100000000 pixels" in line
    small = dict(features, **{"image/encoded": tf.constant([png_bomb(8, 8)])})
    decoded, _ = images.decode_image_batch(small, 8, 8, 1, {"image_encoding": "keep"})
    assert decoded.shape == (1, 8, 8, 1)


def test_an_unterminated_quote_stops_the_conversion(tmp_path, cli, capsys):
    """Before, row 101's quote swallowed the other 99 rows: 100 examples, "1 bad row", exit 0."""
    rows = ["a,b,label"] + [f"{i},{i % 7},{i % 2}" for i in range(200)]
    rows[101] = '100,"6,0'
    (tmp_path / "q.csv").write_text("\n".join(rows) + "\n")
    assert cli("convert", "--pipeline=csv", f"--input={tmp_path / 'q.csv'}",
               f"--output={tmp_path / 'ds'}") == 1
    line = one_error_line(capsys.readouterr().err)
    assert "the quote that opens a field on line 102 never closes" in line
    assert not (tmp_path / "ds" / "dataset.json").exists()


def test_csv_rows_with_bad_bytes_or_huge_fields_are_bad_rows(tmp_path, cli):
    rows = [b"a,b,label"] + [b"%d,%d,%d" % (i, i % 7, i % 2) for i in range(200)]
    rows[50] = b"50,\xff\xfe,1"
    rows[80] = b"80," + b"x" * 200_000 + b",0"
    (tmp_path / "t.csv").write_bytes(b"\n".join(rows) + b"\n")
    assert cli("convert", "--pipeline=csv", f"--input={tmp_path / 't.csv'}",
               f"--output={tmp_path / 'ds'}", "--max_bad_fraction=0.05") == 0
    reasons = sorted(json.loads(line)["reason"] for line in
                     (tmp_path / "ds" / "bad_rows.jsonl").read_text().splitlines())
    assert reasons == ["line 51: bytes that are not UTF-8",
                       "line 81: field larger than field limit (131072)"]
    manifest = json.loads((tmp_path / "ds" / "dataset.json").read_text())
    assert sum(s["num_examples"] for s in manifest["splits"].values()) == 198


def test_jsonl_non_utf8_is_a_bad_row_and_a_stray_huge_label_is_refused(tmp_path, cli, capsys):
    lines = [b'{"text": "hello world %d", "label": %d}' % (i, i % 3) for i in range(100)]
    (tmp_path / "ok.jsonl").write_bytes(b"\n".join(lines + [b'{"text": "\xff\xfe", "label": 1}']))
    assert cli("convert", "--pipeline=jsonl", f"--input={tmp_path / 'ok.jsonl'}",
               f"--output={tmp_path / 'ds'}", "--max_bad_fraction=0.05") == 0
    assert "bytes that are not UTF-8" in (tmp_path / "ds" / "bad_rows.jsonl").read_text()
    (tmp_path / "big.jsonl").write_bytes(b"\n".join(lines + [b'{"text": "x", "label": 100000000}']))
    assert cli("convert", "--pipeline=jsonl", f"--input={tmp_path / 'big.jsonl'}",
               f"--output={tmp_path / 'ds2'}") == 2
    line = one_error_line(capsys.readouterr().err)
    assert "label 100000000 (line big.jsonl:101) would make 100,000,001 classes" in line


BILLION_LAUGHS = "data:\n  info:\n    a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"    {name}: &{name} [{', '.join(['*' + prev] * 9)}]\n"
    for prev, name in zip("abcdefgh", "bcdefghi"))


@pytest.mark.parametrize("content, expected", [
    (BILLION_LAUGHS.encode(), "expands to over 100,000 values through its aliases"),
    (b"data:\n  dir: \xff\xfe\n", "is not UTF-8 text"),
    (b"data: " + b"[" * 50_000 + b"]" * 50_000, "nests too deeply"),
    (b"a: &x\n  b: *x\n", "an alias refers to the node that contains it"),
])
def test_yaml_bombs_and_bad_bytes_are_one_line(content, expected, tmp_path):
    assert len(BILLION_LAUGHS) < 700
    path = tmp_path / "c.yaml"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=expected):
        config_lib.read_yaml(str(path))


def test_ordinary_anchors_still_work(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("train: &t {epochs: 2}\nother: *t\n")
    assert config_lib.read_yaml(str(path)) == {"train": {"epochs": 2}, "other": {"epochs": 2}}


def test_a_head_too_large_for_memory_is_refused_before_it_is_built():
    """5 million classes over 1,024 features: 5 billion parameters, 80 GB to train."""
    from tftrain import models
    from tftrain.errors import DataError

    with pytest.raises(DataError, match=r"5,000,000 outputs .* has 5,\d{3},\d{3},\d{3} parameters"):
        models.build_model("mlp", {"hidden_units": [1024]}, (8, 8, 1), 5_000_000)
    assert models.build_model("mlp", {"hidden_units": [4]}, (8, 8, 1), 200_000).count_params() \
        == 8 * 8 * 4 + 4 + 4 * 200_000 + 200_000
