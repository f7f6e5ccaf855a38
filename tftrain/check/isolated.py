"""The child side of the isolated check (`tftrain.rules.isolated` starts it): runs the whole
`tftrain check` on this CPU, for the target the parent names, and writes the findings as JSON."""
from __future__ import annotations

import dataclasses
import json
import os

from tftrain.rules.report import Target


def main(request_path: str) -> int:
    """The child: runs the check of the request and writes its findings (JSON); returns 0."""
    from tftrain import log_filter, quiet_start

    with open(request_path, encoding="utf-8") as f:
        request = json.load(f)
    log_filter.install()
    quiet_start.import_tensorflow()
    from tftrain import check
    from tftrain import config as config_lib

    config = config_lib.build_config(request["config"])
    report = check.run(config, Target(**request["target"]), request["model_dir"],
                       request["convert_data"])
    partial = request["report"] + ".partial"
    with open(partial, "w", encoding="utf-8") as f:
        json.dump({"findings": [dataclasses.asdict(f) for f in report.findings]}, f)
    os.replace(partial, request["report"])
    return 0
