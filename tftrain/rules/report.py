"""What a check finds, where it runs, and the report: one line per finding, then a summary.

A finding is one line: its status word (`ok`, `advice`, `error`), its family (`storage`,
`precision`, `batch`, `input`, `memory`, `xla`, `data`), what was found and where, and the fix.
The report exits 1 when any finding is an error, else 0. This module does not import TensorFlow.
"""
from __future__ import annotations

import dataclasses

OK, ADVICE, ERROR = "ok", "advice", "error"
STATUSES = (OK, ADVICE, ERROR)
TARGETS = ("tpu", "gpu", "cpu", "multi_worker")


@dataclasses.dataclass(frozen=True)
class Finding:
    """One result of one check: status word, family, what (and where), and the fix."""

    status: str
    family: str
    what: str
    fix: str = ""

    def message(self) -> str:
        """What was found and the fix, as one sentence (no status word)."""
        text = f"{self.what}; fix: {self.fix}" if self.fix else self.what
        return " ".join(text.split())  # one line, whatever the parts held

    def line(self) -> str:
        """The report line: `status  family  what; fix: ...`."""
        return f"{self.status:<6} {self.family:<9} {self.message()}"


@dataclasses.dataclass(frozen=True)
class Target:
    """Where the run would go: the kind of machine, its replica count and, for a TPU, which.

    `replicas` is the number of `tf.distribute` replicas: TPU cores for v2/v3, chips for
    v4/v5e/v5p/v6e (see `hardware.GENERATIONS`), GPUs, or workers. `assumed` says why the count
    is a guess (before connecting to a TPU), and is empty when it was given.
    """

    kind: str
    replicas: int
    tpu_type: str = ""  # a key of hardware.GENERATIONS; "" when unknown
    tpu: str = ""  # runtime.tpu: local | NAME | grpc://host:port ("" = local)
    assumed: str = ""

    @property
    def remote_tpu(self) -> bool:
        """True for a TPU node or pod reached over the network (its hosts are not this VM)."""
        return self.kind == "tpu" and self.tpu not in ("", "local")

    @property
    def replica_word(self) -> str:
        """What one replica is called on this target: TPU core/chip, GPU, worker, replica."""
        if self.kind == "tpu":
            from tftrain.rules import hardware

            return "TPU " + hardware.replica_word(self.tpu_type)
        return {"gpu": "GPU", "multi_worker": "worker"}.get(self.kind, "replica")

    def describe(self) -> str:
        """E.g. 'tpu v5e (local), 8 TPU chips' for the summary line."""
        where = self.kind
        if self.kind == "tpu":
            where += f" {self.tpu_type or 'of unknown type'} ({self.tpu or 'local'})"
        count = f"{self.replicas} {self.replica_word}{'s' if self.replicas != 1 else ''}"
        return f"{where}, {count}" + (f" ({self.assumed})" if self.assumed else "")


@dataclasses.dataclass
class Report:
    """The findings of one check run, in the order they were made."""

    target: Target
    findings: list[Finding] = dataclasses.field(default_factory=list)
    memory: dict | None = None  # the memory plan (`check.memory.Plan.to_json`), when made

    def extend(self, findings) -> None:
        """Adds findings (any iterable of Finding)."""
        self.findings.extend(findings)

    def of(self, status: str) -> list[Finding]:
        """The findings with `status`."""
        return [f for f in self.findings if f.status == status]

    @property
    def exit_code(self) -> int:
        """1 when anything would fail, else 0."""
        return 1 if self.of(ERROR) else 0

    def summary(self) -> str:
        """The last line: counts per status and the verdict for the target."""
        errors, advice, ok = (len(self.of(s)) for s in (ERROR, ADVICE, OK))
        verdict = ("would fail: fix the errors above first" if errors else
                   "ready" + (" (see the advice above)" if advice else ""))
        return (f"summary: {errors} error{'s' if errors != 1 else ''}, {advice} advice, {ok} ok "
                f"for {self.target.describe()}: {verdict}")

    def to_json(self) -> dict:
        """The report as `tftrain check --json` writes it."""
        return {"target": self.target.describe(), "exit_code": self.exit_code,
                "summary": self.summary(),
                "findings": [{"kind": f.status, "family": f.family, "text": f.what,
                              "fix": f.fix} for f in self.findings],
                "memory": self.memory}

    def lines(self) -> list[str]:
        """Every finding's line, then the summary."""
        return [f.line() for f in self.findings] + [self.summary()]
