"""The reading path: the plumbing a learner reads who follows every call of a training script.

What is counted, by AST, without running anything: start at the script's `main` (and at
what its `if __name__ == "__main__":` block calls, `run_cli`), and follow
every name it uses (called or passed on, as `on_rank_0(prepare_out_dir, args)` passes one)
to the function, class or module-level assignment of a ddp_scripts module that defines it,
through `from ddp_scripts.X import name`, `from ddp_scripts import X` then `X.name`, and the
definitions of the same module; then follow each of those the same way. Each definition
reached counts its source lines once (docstring, comments and blank lines inside it
included; a class, all of its methods). The script's own functions are followed but not
counted: they are the lesson, printed whole by the chapters.

What is not followed: torch and the standard library (a learner reads their documentation,
not their code), attributes of objects (`loader.pin_memory`: the class is counted where it
is built), and names that a function imports inside its body, which run only when that
function takes that branch (cifar10.py: only when CIFAR-10 is downloaded). Those are not
hidden: `lazy` lists them and counts what they would add, and the test prints it.

Last, the scripts' entry points: run as a file from any folder, or as a module.
"""
import ast
import os
import subprocess
import sys
from functools import cache

import pytest

from helpers import SCRIPTS

TRAINING_SCRIPTS = ["train_single.py", "train_dp.py", "train_ddp.py", "train_fast.py", "train_fsdp.py"]
# Lines of plumbing a learner follows from each script. The limits leave room (about 10% over
# the counts of 2026-12-06, 624/629/699/907/1166) for a fix that needs a few lines; past them,
# the plumbing has grown by design and is split or cut. The faults handled that day added 51
# to 65 lines: cli's watch of a torchrun worker's parent (reached by every script, run only
# under torchrun), the log read line by line (a blank log is no run), the refusal of a folder
# where a run's file goes, the check of MASTER_ADDR and MASTER_PORT, and for train_fsdp.py the
# shards' check.
MOST_READ = {"train_single.py": 690, "train_dp.py": 690, "train_ddp.py": 770, "train_fast.py": 1000,
             "train_fsdp.py": 1280}


def module_path(name):
    """ddp_scripts/X.py (or X/__init__.py) for the module `ddp_scripts.X`, or None."""
    if not name.startswith("ddp_scripts."):
        return None
    base = SCRIPTS.joinpath(*name.split(".")[1:])
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.exists():
            return path
    return None


@cache
def module(path):
    """(definitions, names) of a module: its top-level functions, classes and assignments by
    name; and what its top-level imports bind: a name to (module path, name in it), or a
    module name to (module path, None)."""
    tree = ast.parse(path.read_text())
    definitions, names = {}, {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            definitions[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        definitions[name.id] = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update(imported(node))
    return definitions, names


def imported(node):
    """What an import statement binds: name -> (module path, name or None for a module)."""
    bound = {}
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        for alias in node.names:
            submodule = module_path(f"{node.module}.{alias.name}")
            if submodule is not None:  # from ddp_scripts import sharding
                bound[alias.asname or alias.name] = (submodule, None)
            elif module_path(node.module) is not None:  # from ddp_scripts.ranks import reduce_sum
                bound[alias.asname or alias.name] = (module_path(node.module), alias.name)
    elif isinstance(node, ast.Import):
        for alias in node.names:
            if alias.asname and module_path(alias.name) is not None:
                bound[alias.asname] = (module_path(alias.name), None)
    return bound


def uses(node, path):
    """The definitions `node` (of the module at `path`) refers to, as (module path, name):
    those its module defines or imports at its top; and, apart, those it reaches only through
    an import inside its own body (lazy)."""
    definitions, names = module(path)
    eager, lazy, inside = set(), set(), {}
    local = {child.arg for child in ast.walk(node) if isinstance(child, ast.arg)}
    for child in ast.walk(node):
        if isinstance(child, ast.Name) and isinstance(child.ctx, ast.Store) and child is not node:
            local.add(child.id)  # a variable of the same name as a definition is not it
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            inside.update(imported(child))
    for child in ast.walk(node):
        if isinstance(child, ast.Attribute) and isinstance(child.value, ast.Name):
            target = inside.get(child.value.id) or names.get(child.value.id)
            if target and target[1] is None:  # sharding.blocks_of
                (lazy if child.value.id in inside else eager).add((target[0], child.attr))
        elif isinstance(child, ast.Name) and child.id not in local:
            if child.id in inside:
                if inside[child.id][1] is not None:
                    lazy.add(inside[child.id])
            elif child.id in names:
                if names[child.id][1] is not None:
                    eager.add(names[child.id])
            elif child.id in definitions:
                eager.add((path, child.id))
    return eager, lazy


def follow(start, not_counted):
    """The definitions reached from `start`: (module path, name) -> lines, and the lazy ones
    (name -> the module whose function imports it)."""
    reached, lazy, todo = {}, {}, list(start)
    while todo:
        path, name = todo.pop()
        node = module(path)[0].get(name)
        if node is None and module(path)[1].get(name, (None, None))[1] is not None:
            todo.append(module(path)[1][name])  # imported there to be imported from there (cli.py)
            continue
        if node is None or (path, name) in reached:
            continue
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        reached[(path, name)] = node.end_lineno - first + 1
        eager, via_import = uses(node, path)
        todo.extend(eager)
        for target in via_import - set(lazy):
            lazy[target] = path.name
    for key in not_counted:
        reached.pop(key, None)
    return reached, lazy


def reading_path(script):
    """(lines of plumbing reached from the script's main, by module; lines the lazy imports
    would add, by module)."""
    path = SCRIPTS / script
    definitions, _ = module(path)
    assert "main" in definitions, f"{script} has no main()"
    local = {(path, name) for name in definitions}
    start = {(path, "main")}
    for node in ast.parse(path.read_text()).body:  # `if __name__ == "__main__": run_cli(main)`
        if isinstance(node, ast.If):
            start |= uses(node, path)[0]
    reached, lazy = follow(list(start), local)
    by_module = {}
    for (where, _), lines in reached.items():
        by_module[where.stem] = by_module.get(where.stem, 0) + lines
    behind, _ = follow(list(lazy), set(reached) | local)
    lazy_by_module = {}
    for (where, _), lines in behind.items():
        lazy_by_module[where.stem] = lazy_by_module.get(where.stem, 0) + lines
    return by_module, lazy_by_module


def without_pythonpath():
    return {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}


def listed(by_module):
    return ", ".join(f"{name} {lines}" for name, lines in sorted(by_module.items(), key=lambda x: -x[1]))


@pytest.mark.parametrize("script", TRAINING_SCRIPTS)
def test_the_reading_path_is_short(script):
    by_module, lazy = reading_path(script)
    total = sum(by_module.values())
    print(f"{script}: {total} lines of plumbing reached ({listed(by_module)}); "
          f"behind imports inside functions: {sum(lazy.values())} ({listed(lazy)})")
    assert {"cli", "options", "data", "models"} <= set(by_module), by_module  # the counter follows
    assert "cifar10" in lazy, lazy  # and sees the download, imported inside load_datasets
    assert total <= MOST_READ[script], f"{script} reaches {total} lines: {by_module}"


@pytest.mark.parametrize("script", ["train_single.py", "train_ddp.py"])
def test_a_script_starts_as_a_file_from_anywhere_and_as_a_module(script, tmp_path):
    """The book prints `python ddp_scripts/train_single.py`; `python -m ddp_scripts.train_single`
    (and torchrun -m) is the same script. Neither needs a line before the imports."""
    as_file = subprocess.run([sys.executable, str(SCRIPTS / script), "--help"], cwd=tmp_path,
                             capture_output=True, text=True, env=without_pythonpath())
    as_module = subprocess.run([sys.executable, "-m", f"ddp_scripts.{script[:-3]}", "--help"],
                               cwd=SCRIPTS.parent, capture_output=True, text=True, env=without_pythonpath())
    for result in (as_file, as_module):
        assert result.returncode == 0 and "--out" in result.stdout, result.stderr
