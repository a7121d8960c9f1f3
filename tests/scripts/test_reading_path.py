"""The reading path: the plumbing a learner reads who follows every call of a training script.

What is counted, by AST, without running anything: start at the script's `main` (and at
what its `if __name__ == "__main__":` block calls, `run_cli`), and follow every name it uses
(called or passed on, as `on_rank_0(prepare_out_dir, args)` passes one) to the function,
class or module-level assignment of the package that defines it. Every import counts,
wherever it sits: at a module's top (inside a `try` too), or inside a function, whichever
branch it is under. Then follow each definition reached the same way. Each counts its source
lines once (docstring, comments and blank lines inside it included; a class, all of its
methods). The script's own functions are followed but not counted: they are the lesson,
printed whole by the chapters.

What is not followed: torch and the standard library (a learner reads their documentation,
not their code), and attributes of objects (`loader.pin_memory`: the class is counted where
it is built).

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
# The target for the lines of plumbing a learner meets from train_ddp.py, every import
# followed: the learner who follows each call of the chapter-5 script reads at most this much
# beside it. A target, not today's count: the test that holds it is marked xfail until the
# plumbing meets it. The other scripts build on it and add their own lesson's plumbing
# (train_fast.py: speed.py's levers; train_fsdp.py: sharding and the sharded checkpoint),
# counted and printed.
MOST_READ = 900
# Until then, a ceiling per script, so that the plumbing does not grow while it is cut: about
# 8% above the counts of 2026-12-07, every import followed (1,288/1,293/1,397/1,605/1,723),
# room for a fix that needs a few lines. Past one, the plumbing grew by design: cut it.
CEILING = {"train_single.py": 1400, "train_dp.py": 1400, "train_ddp.py": 1500, "train_fast.py": 1730,
           "train_fsdp.py": 1860}


def module_path(root, name):
    """root/X.py (or X/__init__.py) for the module `<root's name>.X`, or None."""
    if not name.startswith(root.name + "."):
        return None
    base = root.joinpath(*name.split(".")[1:])
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.exists():
            return path
    return None


def top_statements(body):
    """A module's statements, those inside its top-level `if` and `try` blocks included."""
    for node in body:
        if isinstance(node, (ast.If, ast.Try)):
            yield from top_statements(node.body + node.orelse + getattr(node, "finalbody", [])
                                      + [line for handler in getattr(node, "handlers", [])
                                         for line in handler.body])
        else:
            yield node


@cache
def module(root, path):
    """(definitions, names) of a module: its top-level functions, classes and assignments by
    name; and what its top-level imports bind: a name to (module path, name in it), or a
    module name to (module path, None)."""
    definitions, names = {}, {}
    for node in top_statements(ast.parse(path.read_text()).body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            definitions[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        definitions.setdefault(name.id, node)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update(imported(root, node))
    return definitions, names


def imported(root, node):
    """What an import statement binds: name -> (module path, name or None for a module)."""
    bound = {}
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        for alias in node.names:
            submodule = module_path(root, f"{node.module}.{alias.name}")
            if submodule is not None:  # from ddp_scripts import sharding
                bound[alias.asname or alias.name] = (submodule, None)
            elif module_path(root, node.module) is not None:  # from ddp_scripts.ranks import reduce_sum
                bound[alias.asname or alias.name] = (module_path(root, node.module), alias.name)
    elif isinstance(node, ast.Import):
        for alias in node.names:
            if alias.asname and module_path(root, alias.name) is not None:
                bound[alias.asname] = (module_path(root, alias.name), None)
    return bound


def uses(root, node, path):
    """The definitions `node` (of the module at `path`) refers to, as (module path, name):
    those its module defines or imports, and those it imports inside its own body."""
    definitions, names = module(root, path)
    found, local, inside = set(), set(), {}
    local = {child.arg for child in ast.walk(node) if isinstance(child, ast.arg)}
    for child in ast.walk(node):
        if isinstance(child, ast.Name) and isinstance(child.ctx, ast.Store) and child is not node:
            local.add(child.id)  # a variable of the same name as a definition is not it
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            inside.update(imported(root, child))
    bound = {**names, **inside}
    for child in ast.walk(node):
        if isinstance(child, ast.Attribute) and isinstance(child.value, ast.Name):
            target = bound.get(child.value.id)
            if target and target[1] is None:  # sharding.blocks_of
                found.add((target[0], child.attr))
        elif isinstance(child, ast.Name) and (child.id in inside or child.id not in local):
            if child.id in bound:
                if bound[child.id][1] is not None:
                    found.add(bound[child.id])
            elif child.id in definitions:
                found.add((path, child.id))
    return found


def follow(root, start, not_counted):
    """The definitions reached from `start`: (module path, name) -> lines."""
    reached, todo = {}, list(start)
    while todo:
        path, name = todo.pop()
        definitions, names = module(root, path)
        node = definitions.get(name)
        if node is None and names.get(name, (None, None))[1] is not None:
            todo.append(names[name])  # imported there to be imported from there (cli.py)
            continue
        if node is None or (path, name) in reached:
            continue
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        reached[(path, name)] = node.end_lineno - first + 1
        todo.extend(uses(root, node, path))
    for key in not_counted:
        reached.pop(key, None)
    return reached


def reading_path(script):
    """The lines of plumbing reached from the script at `script` (a path inside its
    package's folder), by module."""
    root = script.parent
    definitions, _ = module(root, script)
    assert "main" in definitions, f"{script.name} has no main()"
    start = {(script, "main")}
    for node in ast.parse(script.read_text()).body:  # `if __name__ == "__main__": run_cli(main)`
        if isinstance(node, ast.If):
            start |= uses(root, node, script)
    reached = follow(root, start, {(script, name) for name in definitions})
    by_module = {}
    for (where, _), lines in reached.items():
        by_module[where.stem] = by_module.get(where.stem, 0) + lines
    return by_module


def without_pythonpath():
    return {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}


def listed(by_module):
    return ", ".join(f"{name} {lines}" for name, lines in sorted(by_module.items(), key=lambda x: -x[1]))


def test_the_counter_follows_every_import_wherever_it_sits(tmp_path):
    """A made-up package: main calls helpers.work, which imports rare.branch inside its body
    (and helpers imports fallback.spare inside a try at its top). Every one is reached, and
    only what is used: rare.unused is not."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "script.py").write_text(
        "from pkg.helpers import work\n\n\ndef main():\n    work()\n\n\n"
        "if __name__ == '__main__':\n    main()\n")
    (package / "helpers.py").write_text(
        "try:\n    from pkg.fallback import spare\nexcept ImportError:\n    spare = None\n\n\n"
        "def work():\n    from pkg.rare import branch\n    return branch() + spare()\n")
    (package / "rare.py").write_text("def branch():\n    x = 1\n    return x\n\n\ndef unused():\n    return 0\n")
    (package / "fallback.py").write_text("def spare():\n    return 2\n")
    assert reading_path(package / "script.py") == {"helpers": 3, "rare": 3, "fallback": 2}


@pytest.mark.parametrize("script", TRAINING_SCRIPTS)
def test_the_reading_path_is_counted_whole(script):
    by_module = reading_path(SCRIPTS / script)
    total = sum(by_module.values())
    print(f"{script}: {total} lines of plumbing reached ({listed(by_module)})")
    assert {"cli", "options", "data", "models", "cifar10", "mishaps"} <= set(by_module), by_module
    assert total <= CEILING[script], f"{script} reaches {total} lines, over {CEILING[script]}"


@pytest.mark.xfail(strict=True, reason="a target the plumbing does not meet yet: it fails "
                   "until the cut is made, and then this mark goes")
def test_train_ddp_reaches_at_most_the_target():
    by_module = reading_path(SCRIPTS / "train_ddp.py")
    assert sum(by_module.values()) <= MOST_READ, f"train_ddp.py reaches {listed(by_module)}"


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
