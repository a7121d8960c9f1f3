"""How ddp_scripts/ and the tests are laid out: a short top level, no import circle, and every
test that skips for lack of a GPU in the `gpu` lane (which `make gpu-check` runs)."""
import ast
import types

from helpers import ROOT

SCRIPTS = ROOT / "ddp_scripts"
TRAINING_SCRIPTS = {"train_single", "train_dp", "train_ddp", "train_fast", "train_fsdp"}
# At the top beside the scripts, though no script imports it: the launcher starts them (from
# notebooks, the benchmark and the tests), so it sits where they are.
STARTS_THE_SCRIPTS = {"launcher"}


def module_name(path):
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path, modules):
    """The modules of `modules` that the file at `path` imports, at its top or inside a function."""
    here = module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join([*package[:len(package) - node.level + 1], *([node.module] if node.module else [])]) \
                if node.level else node.module
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)   # from package import module
    return {name for name in found if name in modules and name != module_name(path)}


def import_graph():
    paths = {module_name(path): path for path in SCRIPTS.rglob("*.py")}
    return {name: imported_modules(path, paths) for name, path in paths.items()}


def circles(graph):
    """Every import circle of `graph` (module -> the modules it imports), each as a path."""
    found, done = [], set()

    def visit(name, path):
        if name in path:
            found.append(path[path.index(name):] + [name])
            return
        if name in done:
            return
        for other in sorted(graph.get(name, ())):
            visit(other, path + [name])
        done.add(name)
    for name in sorted(graph):
        visit(name, [])
    return found


def test_the_circle_finder_finds_a_planted_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_module_of_ddp_scripts_is_in_an_import_circle():
    graph = import_graph()
    assert "ddp_scripts.launcher" in graph["ddp_scripts.measure.benchmark"]   # the graph sees imports
    assert "ddp_scripts.practice.hooks" in graph["ddp_scripts.recorders.step_parts"]
    assert circles(graph) == []


def reached(graph, start):
    """Every module `start` imports, and what those import, at any depth."""
    found, todo = set(), list(start)
    while todo:
        for other in graph.get(todo.pop(), ()):
            if other not in found:
                found.add(other)
                todo.append(other)
    return found


def not_plumbing(graph, top, scripts):
    """The top-level modules that are neither a training script nor imported by one."""
    return sorted(set(top) - set(scripts) - reached(graph, scripts))


def test_a_planted_module_no_script_imports_is_found_at_the_top():
    graph = {"train": {"cli"}, "cli": {"runfiles"}, "runfiles": set(), "stray": {"cli"}}
    assert not_plumbing(graph, ["train", "cli", "runfiles", "stray"], ["train"]) == ["stray"]


def test_the_top_level_holds_the_training_scripts_and_their_plumbing_only():
    graph = {name.removeprefix("ddp_scripts."): {other.removeprefix("ddp_scripts.") for other in imports}
             for name, imports in import_graph().items()}
    top = [path.stem for path in SCRIPTS.glob("*.py") if path.stem != "__init__"]
    assert TRAINING_SCRIPTS <= set(top)
    assert not_plumbing(graph, top, TRAINING_SCRIPTS) == sorted(STARTS_THE_SCRIPTS)
    folders = {path.parent.name for path in SCRIPTS.glob("*/__init__.py")}
    assert folders == {"recorders", "measure", "practice", "mistakes", "fit"}


# --- Every test that needs a GPU is in the gpu lane ------------------------------------------

def no_gpu_namespace(tree):
    """The names a test module's skip conditions read, as they are on a machine without a GPU:
    torch.cuda says no, and each module-level constant computed from it follows."""
    cuda = types.SimpleNamespace(is_available=lambda: False, device_count=lambda: 0)
    names = {"torch": types.SimpleNamespace(cuda=cuda)}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                names[node.targets[0].id] = eval(compile(ast.Expression(node.value), "<test>", "eval"),
                                                 {"__builtins__": {}}, dict(names))
            except Exception:   # a constant that does not come from torch.cuda
                pass
    return names


def is_mark(node, name):
    """`node` is pytest.mark.<name> or pytest.mark.<name>(...)."""
    node = node.func if isinstance(node, ast.Call) else node
    return isinstance(node, ast.Attribute) and node.attr == name and ast.unparse(node.value) == "pytest.mark"


def unmarked_gpu_tests(source):
    """The names of the tests in `source` that a skipif skips on a machine without a GPU (its
    condition reads torch.cuda or a name of GPUs) while they carry no `gpu` mark."""
    tree = ast.parse(source)
    names = no_gpu_namespace(tree)
    marks = {node.targets[0].id: node.value for node in tree.body
             if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)}
    module_marks = marks.get("pytestmark")
    module_gpu = module_marks is not None and any(is_mark(node, "gpu") for node in ast.walk(module_marks))
    missing = []
    for node in tree.body:
        if not (isinstance(node, ast.FunctionDef) and node.name.startswith("test_")):
            continue
        decorators = [marks.get(d.id, d) if isinstance(d, ast.Name) else d for d in node.decorator_list]
        gpu = module_gpu or any(is_mark(d, "gpu") for d in decorators)
        for skip in (d for d in decorators if is_mark(d, "skipif") and isinstance(d, ast.Call) and d.args):
            condition = ast.unparse(skip.args[0])
            if "cuda" not in condition.lower() and "gpu" not in condition.lower():
                continue
            if eval(compile(ast.Expression(skip.args[0]), "<test>", "eval"), {"__builtins__": {}}, names) \
                    and not gpu:
                missing.append(node.name)
    return missing


def test_the_lane_check_finds_a_gpu_test_without_the_mark():
    source = ("import pytest, torch\nGPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0\n"
              "two = pytest.mark.skipif(GPUS < 2, reason='two GPUs')\n"
              "@pytest.mark.skipif(GPUS < 2, reason='two GPUs')\ndef test_unmarked(): pass\n"
              "@two\ndef test_unmarked_by_name(): pass\n"
              "@pytest.mark.gpu\n@two\ndef test_marked(): pass\n"
              "@pytest.mark.skipif(torch.cuda.is_available(), reason='without a GPU')\ndef test_cpu(): pass\n")
    assert unmarked_gpu_tests(source) == ["test_unmarked", "test_unmarked_by_name"]


def test_every_test_that_skips_without_a_gpu_is_marked_gpu():
    paths = sorted((ROOT / "tests").rglob("test_*.py"))
    assert len(paths) > 40
    missing = {str(path.relative_to(ROOT)): names for path in paths
               if (names := unmarked_gpu_tests(path.read_text()))}
    assert missing == {}, f"skip without a GPU but are not marked gpu (pytest -m gpu misses them): {missing}"
