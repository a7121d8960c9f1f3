"""How ddp_scripts/ and the tests are laid out: a short top level, no import circle, and every
test that skips for lack of a GPU in the `gpu` lane (which `make gpu-check` runs)."""
import ast
import types

from helpers import ROOT

SCRIPTS = ROOT / "ddp_scripts"
TRAINING_SCRIPTS = {"train_single", "train_dp", "train_ddp", "train_fast", "train_fsdp"}
# At the top beside the scripts, though no training script imports it: the launcher starts
# them (from notebooks, the benchmark and the tests), so it sits where they are.
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


# --- The plumbing imports only what a reader can follow ---------------------------------------

# What imports a module by a name known only when the code runs: a reader (and the count of
# tests/scripts/test_reading_path.py) cannot follow it.
DYNAMIC_MODULES = {"importlib", "runpy"}
DYNAMIC_CALLS = {"__import__", "exec", "eval"}


def dynamic_imports(source):
    """(line, what) for each import in `source` that names its module only when it runs:
    importlib or runpy imported, or __import__, exec or eval called."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, f"import {alias.name}") for alias in node.names
                      if alias.name.split(".")[0] in DYNAMIC_MODULES]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module.split(".")[0] in DYNAMIC_MODULES:
            found.append((node.lineno, f"from {node.module} import"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in DYNAMIC_CALLS:
            found.append((node.lineno, f"{node.func.id}()"))
    return sorted(found)


def test_a_planted_dynamic_import_is_found_with_its_line():
    source = ("import os\nimport importlib\nfrom importlib import import_module\n\n\ndef load(name):\n"
              "    exec('x = 1')\n    return __import__(name), eval('1'), os.path.join('a')\n")
    assert dynamic_imports(source) == [(2, "import importlib"), (3, "from importlib import"), (7, "exec()"),
                                       (8, "__import__()"), (8, "eval()")]
    assert dynamic_imports("import os\nfrom . import importlib\nmodel.eval()\n") == []


def test_no_module_a_training_script_reaches_imports_by_a_name_known_only_when_it_runs():
    """Every module of ddp_scripts/ that a training script imports, at any depth. fit/trace.py
    imports the reader's own model by the name given on its command line; no script reaches it."""
    graph = import_graph()
    scripts = {f"ddp_scripts.{name}" for name in TRAINING_SCRIPTS}
    paths = {module_name(path): path for path in SCRIPTS.rglob("*.py")}
    plumbing = sorted(scripts | reached(graph, scripts))
    assert "ddp_scripts.out_dir" in plumbing and len(plumbing) > 10
    found = [f"{paths[name].relative_to(ROOT)}:{line}: {what}" for name in plumbing
             for line, what in dynamic_imports(paths[name].read_text())]
    assert found == [], f"imports no reader can follow: {found}"


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
