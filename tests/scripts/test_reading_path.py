"""The reading path: the plumbing a learner reads who follows every call of a training script.

What is counted, by AST, without running anything: start at the script's `main` (and at
what its `if __name__ == "__main__":` block calls, `run_cli`), and follow every name it uses
(called or passed on, as `on_rank_0(prepare_out_dir, args)` passes one) to the function,
class or module-level assignment of the package that defines it. Every import counts,
wherever it sits: at a module's top (inside an `if`, `try` or `with` too), inside a function
whichever branch it is under, or in a class's body (then `self.name`); and in every form:
`from a import b`, `from . import b`, `from ..a import b`, `import a.b as c`, `import a.b`
(then `a.b.name`), `from a import *`. An import whose module is named only when it runs
(importlib, __import__) cannot be followed: tests/scripts/test_layout.py keeps it out of
what the scripts import. Then follow each definition reached the same way. Each counts its source
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
# 8% above the counts after the second cut of 2026-12-07, every import followed
# (1,240/1,245/1,349/1,557/1,679), room for a fix that needs a few lines. Past one, the
# plumbing grew by design: cut it.
CEILING = {"train_single.py": 1340, "train_dp.py": 1345, "train_ddp.py": 1455, "train_fast.py": 1680,
           "train_fsdp.py": 1815}


def module_name(root, path):
    """The dotted name of the module at `path` inside the package folder `root`."""
    parts = (root.name, *path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_path(root, name):
    """root/X.py (or X/__init__.py) for the module `<root's name>.X`, or None."""
    if name == root.name:
        return root / "__init__.py" if (root / "__init__.py").exists() else None
    if not name.startswith(root.name + "."):
        return None
    base = root.joinpath(*name.split(".")[1:])
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.exists():
            return path
    return None


def top_statements(body):
    """A module's statements, those inside its top-level `if`, `try`, `with`, `for` and
    `while` blocks included."""
    for node in body:
        if isinstance(node, (ast.If, ast.Try, ast.TryStar, ast.With, ast.AsyncWith, ast.For,
                             ast.AsyncFor, ast.While)):
            yield from top_statements(node.body + getattr(node, "orelse", []) + getattr(node, "finalbody", [])
                                      + [line for handler in getattr(node, "handlers", [])
                                         for line in handler.body])
        elif isinstance(node, ast.Match):
            yield from top_statements([line for case in node.cases for line in case.body])
        else:
            yield node


@cache
def module(root, path):
    """(definitions, names, stars) of a module: its top-level functions, classes and
    assignments by name; what its top-level imports bind: a name to (module path, name in
    it), or a module name to (module path, None); and the modules it imports `*` from."""
    definitions, names, stars = {}, {}, []
    for node in top_statements(ast.parse(path.read_text()).body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            definitions[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        definitions.setdefault(name.id, node)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update(imported(root, node, path))
            if isinstance(node, ast.ImportFrom) and node.names[0].name == "*":
                source = module_path(root, from_module(root, node, path))
                if source is not None:
                    stars.append(source)
    return definitions, names, stars


def from_module(root, node, path):
    """The dotted name of the module a `from ... import` reads, its dots resolved."""
    if not node.level:
        return node.module
    here = module_name(root, path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    return ".".join([*package[:len(package) - node.level + 1], *([node.module] if node.module else [])])


def imported(root, node, path):
    """What an import statement in the module at `path` binds: name -> (module path, name or
    None for a module)."""
    bound = {}
    if isinstance(node, ast.ImportFrom):
        source = from_module(root, node, path)
        for alias in node.names:
            if alias.name == "*":
                continue  # from ddp_scripts.ranks import *: the module's stars
            submodule = module_path(root, f"{source}.{alias.name}")
            if submodule is not None:  # from ddp_scripts import sharding, from . import sharding
                bound[alias.asname or alias.name] = (submodule, None)
            elif module_path(root, source) is not None:  # from ddp_scripts.ranks import reduce_sum
                bound[alias.asname or alias.name] = (module_path(root, source), alias.name)
    elif isinstance(node, ast.Import):
        for alias in node.names:
            if alias.asname:  # import ddp_scripts.ranks as ranks
                if module_path(root, alias.name) is not None:
                    bound[alias.asname] = (module_path(root, alias.name), None)
            else:  # import ddp_scripts.ranks binds ddp_scripts: ddp_scripts.ranks.reduce_sum
                top = alias.name.split(".")[0]
                if module_path(root, top) is not None:
                    bound[top] = (module_path(root, top), None)
    return bound


def starred(root, path, name, seen=()):
    """(module path, name) for a `name` that the module at `path` gets from a `*` import, or None."""
    for source in module(root, path)[2]:
        if source in seen or name.startswith("_"):
            continue
        definitions, names, _ = module(root, source)
        if name in definitions or name in names:
            return (source, name)
        found = starred(root, source, name, (*seen, path))
        if found:
            return found
    return None


def attribute_chain(node):
    """['a', 'b', 'c'] for a.b.c, or None where the chain does not start at a name."""
    chain = []
    while isinstance(node, ast.Attribute):
        chain.insert(0, node.attr)
        node = node.value
    return [node.id, *chain] if isinstance(node, ast.Name) else None


def resolve(root, target, chain):
    """The definition (module path, name) that the attributes `chain` reach from `target`, a
    binding (module path, name or None for a module); None where they reach a module only."""
    path, name = target
    for attr in chain:
        if name is not None:
            break  # an attribute of a definition: the definition is counted whole
        submodule = module_path(root, f"{module_name(root, path)}.{attr}")
        if submodule is not None:
            path = submodule
        else:
            name = attr
    return (path, name) if name is not None else None


def uses(root, node, path):
    """The definitions `node` (of the module at `path`) refers to, as (module path, name):
    those its module defines or imports, and those it imports inside its own body (a class's
    imports in its body are also its attributes: self.branch)."""
    definitions, names, _ = module(root, path)
    found, local, inside = set(), set(), {}
    local = {child.arg for child in ast.walk(node) if isinstance(child, ast.arg)}
    for child in ast.walk(node):
        if isinstance(child, ast.Name) and isinstance(child.ctx, ast.Store) and child is not node:
            local.add(child.id)  # a variable of the same name as a definition is not it
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            inside.update(imported(root, child, path))
    in_class = {}
    if isinstance(node, ast.ClassDef):
        for child in top_statements(node.body):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                in_class.update(imported(root, child, path))
    bound = {**names, **inside}

    def visible(name):
        return name in inside or name not in local

    for child in ast.walk(node):
        if isinstance(child, ast.Attribute):
            chain = attribute_chain(child)
            if chain is None:
                continue
            if chain[0] in bound and visible(chain[0]):  # sharding.blocks_of, ddp_scripts.ranks.reduce_sum
                reached = resolve(root, bound[chain[0]], chain[1:])
            elif len(chain) > 1 and chain[1] in in_class:  # self.branch
                reached = resolve(root, in_class[chain[1]], chain[2:])
            else:
                continue
            if reached is not None:
                found.add(reached)
        elif isinstance(child, ast.Name) and visible(child.id):
            if child.id in bound:
                if bound[child.id][1] is not None:
                    found.add(bound[child.id])
            elif child.id in definitions:
                found.add((path, child.id))
            elif (star := starred(root, path, child.id)) is not None:
                found.add(star)
    return found


def follow(root, start, not_counted):
    """The definitions reached from `start`: (module path, name) -> lines."""
    reached, todo = {}, list(start)
    while todo:
        path, name = todo.pop()
        definitions, names, _ = module(root, path)
        node = definitions.get(name)
        if node is None and names.get(name, (None, None))[1] is not None:
            todo.append(names[name])  # imported there to be imported from there (cli.py)
            continue
        if node is None and name not in names and (star := starred(root, path, name)) is not None:
            todo.append(star)  # imported there with a star
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
    definitions, _, _ = module(root, script)
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


def function(name, lines, value="0"):
    """A function of `lines` lines (three at least) that starts from `value`."""
    return f"def {name}():\n    x = {value}\n" + "    x += 1\n" * (lines - 3) + "    return x\n"


def test_the_counter_follows_every_import_wherever_it_sits(tmp_path):
    """A made-up package that imports in every form Python has: each form reaches its own
    module, of its own length, so a form the counter missed would leave its module out. Only
    what is used is counted: rare.unused and starred.dull are not."""
    package = tmp_path / "pkg"
    (package / "deep").mkdir(parents=True)
    files = {
        "__init__.py": "",
        "script.py": "from pkg.helpers import work\nfrom pkg.launch import run_cli\n\n\n"
                     "def main():\n    work()\n\n\nif __name__ == '__main__':\n    run_cli(main)\n",
        "helpers.py": "import contextlib\nimport sys\n"
                      "import pkg.deep.leaf\n"                      # import a.b.c: pkg.deep.leaf.leafy()
                      "import pkg.aliased as al\n"                  # import x as y
                      "from pkg import sub\n"                       # from package import module
                      "from . import near\n"                        # relative, a module
                      "from .close import nearby\n"                 # relative, a name
                      "from pkg.starred import *\n"                 # star
                      "from pkg.settings import LIMIT\n"            # a module-level assignment
                      "try:\n    from pkg.fallback import spare\nexcept ImportError:\n    spare = None\n"
                      "if sys.version_info >= (3,):\n    from pkg.gated import gate\n"
                      "with contextlib.suppress(ImportError):\n    from pkg.guarded import guard\n\n\n"
                      "class Worker:\n    from pkg.klass import method\n\n"
                      "    def run(self):\n        return self.method()\n\n\n"
                      "def work():\n    from pkg.rare import branch\n"  # inside a function
                      "    return (branch() + spare() + al.aliased() + sub.subbed() + near.nearer() + nearby()\n"
                      "            + shine() + LIMIT[0] + gate() + guard() + pkg.deep.leaf.leafy() + Worker().run())\n",
        "launch.py": function("run_cli", 3),
        "fallback.py": function("spare", 4),
        "rare.py": function("branch", 5) + "\n\n" + function("unused", 3),
        "aliased.py": function("aliased", 6),
        "sub.py": function("subbed", 7),
        "near.py": function("nearer", 8),
        "close.py": function("nearby", 10),
        "starred.py": function("shine", 15) + "\n\n" + function("dull", 3),
        "settings.py": "LIMIT = (\n" + "    1,\n" * 9 + ")\n",  # 11 lines
        "gated.py": function("gate", 12),
        "guarded.py": function("guard", 13),
        "klass.py": function("method", 14),
        "deep/__init__.py": "",
        "deep/leaf.py": "from ..up import lifted\n\n\n" + function("leafy", 16, "lifted()"),  # two dots
        "up.py": function("lifted", 17),
    }
    for name, text in files.items():
        (package / name).write_text(text)
    assert reading_path(package / "script.py") == {
        "launch": 3, "fallback": 4, "rare": 5, "aliased": 6, "sub": 7, "near": 8, "helpers": 9, "close": 10,
        "settings": 11, "gated": 12, "guarded": 13, "klass": 14, "starred": 15, "leaf": 16, "up": 17}


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
