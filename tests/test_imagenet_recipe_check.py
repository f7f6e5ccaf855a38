"""configs/imagenet_resnet50.yaml's `tftrain check` header commands as written, for the two
targets it claims (tpu, gpu), on TFRecords in the ImageNet layout (tests/imagenet_layout.py)
written in place of the user's /data/imagenet, at a batch of 8 (the generated split holds 72
examples): ResNet-50 at 224, its train and evaluation steps compiled by XLA as each target
compiles them. A file of its own, so that it runs beside the recipe's training
(tests/test_imagenet_recipe.py) rather than after it."""
import pytest

from tests import documented
from tests.test_documented_commands import assert_check_passes
from tests.test_imagenet_recipe import _as_user, user  # noqa: F401  (the records fixture)


@pytest.mark.parametrize("target", ["tpu", "gpu"])
def test_check_passes_for_the_claimed_targets(target, user, capfd, cli):
    commands = {"tpu": documented.args("tftrain check --config=imagenet_resnet50 --target=tpu "
                                       "--params_override=data.dir=/data/imagenet"),
                "gpu": documented.args("tftrain check --config=imagenet_resnet50 --target=gpu "
                                       "--params_override=data.dir=/data/imagenet")}
    home, records = user
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(home)
        capfd.readouterr()
        assert cli(*_as_user(commands[target], records, "data.batch_size=8")) == 0
    out, err = capfd.readouterr()
    assert_check_passes(out, err, target)
