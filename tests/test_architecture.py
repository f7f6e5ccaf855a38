"""The house rules, checked in seconds: the layers (import-linter's contract in setup.cfg), no
import cycle (function-level imports included), every module in a layer, no function over 80
lines, and the backends implementing the one `Backend` protocol."""
import ast
import configparser
import inspect
import os
import subprocess
import sys

from tests.conftest import REPO

PACKAGES = ("tftrain", "pipelines")
MAX_FUNCTION_LINES = 80
# Package modules that belong to no layer: the root (it only selects tf-keras) and
# `tftrain.data`, whose `load` forwards to `tftrain.data.reader` (the data layer's own split
# into format modules below `pipelines` and reading/writing above it is in the contract).
OUTSIDE_LAYERS = {"tftrain", "tftrain.data"}


def _modules() -> dict[str, str]:
    """{dotted module name: file path} of every module of tftrain/ and pipelines/."""
    found = {}
    for package in PACKAGES:
        for folder, _, files in os.walk(os.path.join(REPO, package)):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    dotted = os.path.relpath(path, REPO)[:-3].replace(os.sep, ".")
                    found[dotted.removesuffix(".__init__")] = path
    return found


def _imports(modules: dict[str, str]) -> dict[str, set[str]]:
    """{module: the modules of ours it imports anywhere in its file, functions included}."""
    def ours(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for module, path in modules.items():
        package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, ast.Import):
                targets.update(ours(alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                for alias in node.names:  # `from pkg import module` imports pkg.module
                    full = f"{base}.{alias.name}"
                    targets.add(full if full in modules else ours(base))
        graph[module] = {t for t in targets if t and t != module}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _layer_modules() -> list[str]:
    parser = configparser.ConfigParser()
    parser.read(os.path.join(REPO, "setup.cfg"))
    layers = parser["importlinter:contract:layers"]["layers"].split()
    return [name for name in layers if name not in ("|", ":")]


def test_lint_imports_keeps_the_layers():
    lint = os.path.join(os.path.dirname(sys.executable), "lint-imports")
    done = subprocess.run([lint, "--no-cache"], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "Contracts: 1 kept, 0 broken." in done.stdout, done.stdout[-2000:]


def test_no_import_cycle_even_inside_functions():
    assert _cycles(_imports(_modules())) == []


def test_the_cycle_finder_finds_one():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_every_module_is_in_a_layer():
    layers = _layer_modules()
    outside = [module for module in _modules() if module not in OUTSIDE_LAYERS
               and not any(module == layer or module.startswith(layer + ".") for layer in layers)]
    assert outside == [], f"add these to a layer of setup.cfg's import-linter contract: {outside}"


def test_no_function_over_80_lines():
    long = []
    for module, path in _modules().items():
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{module}.{node.name}: {lines} lines")
    assert long == [], long


def test_every_backend_implements_the_protocol():
    from tftrain.engine import backends

    wanted = {name for name, value in vars(backends.Backend).items()
              if inspect.isfunction(value) and not name.startswith("_")}
    assert {"set_up", "training_data", "build", "summary"} <= wanted
    from tftrain.engine import pipeline_backend

    for backend in (backends.StrategyBackend, backends.DTensorBackend,
                    pipeline_backend.PipelineBackend):
        for name in wanted:
            method = getattr(backend, name, None)
            assert callable(method), f"{backend.__name__} has no {name}"
            assert (list(inspect.signature(method).parameters)
                    == list(inspect.signature(getattr(backends.Backend, name)).parameters)), (
                backend.__name__, name)
