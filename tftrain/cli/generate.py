"""Write text with a trained language model: its export continues the prompt.

Reads the run's export (RUN/export, its highest version) and its dataset's vocabulary, then
adds --max_tokens tokens one at a time: the most likely one with --temperature=0 (greedy),
else one drawn from the softmax of logits / temperature (among the --top_k most likely when
--top_k > 0), reproducibly for a --seed. Prints the prompt and what follows it.
Example: tftrain generate --model_dir=runs/text_lm --prompt="The " --max_tokens=80
"""
from absl import flags

from tftrain import quiet_start
from tftrain.cli.common import require, use_flags

FLAGS = flags.FLAGS
use_flags(__name__, "model_dir", "seed", "top_k")
flags.DEFINE_string("prompt", None, "The text to continue.")
flags.DEFINE_integer("max_tokens", 200, "How many tokens (characters) to add.", lower_bound=0)
flags.DEFINE_float("temperature", 0.8, "Sampling temperature; 0: greedy (the most likely "
                   "token each time).", lower_bound=0.0)


def main(argv):
    require("model_dir")
    from tftrain.errors import ConfigError

    if not FLAGS.prompt:
        raise ConfigError("--prompt is empty: give the text to continue, e.g. --prompt='The '")
    quiet_start.import_tensorflow()
    from tftrain.engine import generate

    print(generate.generate(FLAGS.model_dir, FLAGS.prompt, FLAGS.max_tokens, FLAGS.temperature,
                            FLAGS.top_k or 0, FLAGS.seed))
    return 0
