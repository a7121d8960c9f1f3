"""Python to JavaScript, for the small part of Python that rules.py and shapes.py are written in.

    javascript = transpile_files([rules_path, shapes_path])   # one script, functions and constants

The page's calculator runs the same rules as `python -m ddp_scripts.fit`: the book's build turns
the Python into JavaScript, so there is no second copy of the arithmetic to drift. What it
accepts: module-level constants (lists and dicts) and functions; in a function, assignments
(and +=, -=, *=, //=), if/else, `for x in list` and `for i in range(...)` (a step must be a
number), return, calls of the module's functions, len() and list.append(); expressions of
numbers (int only), strings, True/False/None, lists, dicts with string keys, subscripts, + - *
//, comparisons, and/or/not. Anything else raises TranspileError, naming the line: JavaScript
would run it differently (a float, x[-1], `in`, a tuple) or not at all.

Python's // on integers is floor division: it becomes floorDiv(), exact below 2**53. Python's
variables belong to the function, so each function declares all of its names at its top.
Two differences are left to the writer: + on two lists, and the truth of an empty list (false
in Python, true in JavaScript). The rules use + on numbers and strings, and test booleans.
"""
import ast
import json
from pathlib import Path

# JavaScript's words that a Python name must not be (it would not parse, or mean another thing).
RESERVED = set("""arguments await break case catch class const continue debugger default delete do
else enum eval export extends false finally for function if implements import in instanceof
interface let new null package private protected public return static super switch this throw
true try typeof var void while with yield floorDiv""".split())
OPERATORS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*"}
COMPARISONS = {ast.Eq: "===", ast.NotEq: "!==", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">",
               ast.GtE: ">="}
# Python's a // b for integers, exact for a and b below 2**53: a / b rounds to the nearest
# double, and that never reaches the next integer, as the gap to it (at least 1/b) is more
# than half a unit in its last place; the floor then rounds towards minus infinity, as // does.
PRELUDE = """function floorDiv(a, b) {
  return Math.floor(a / b);
}
"""


class TranspileError(ValueError):
    pass


def refuse(node, what, source="the module"):
    raise TranspileError(f"{source}, line {node.lineno}: {what} is outside the subset tojs.py "
                         "turns into JavaScript")


class Module:
    """One module's functions and constants, in JavaScript."""

    def __init__(self, tree, name, known):
        self.name, self.known = name, known   # known: the functions every module defines
        self.lines = []
        for node in tree.body:
            if is_docstring(node):
                continue
            if isinstance(node, ast.FunctionDef):
                self.function(node)
            elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                self.lines.append(f"const {self.name_of(node.targets[0])} = {self.expr(node.value)};")
            else:
                self.refuse(node, f"a module-level {type(node).__name__}")

    def refuse(self, node, what):
        refuse(node, what, self.name)

    def name_of(self, node):
        if node.id in RESERVED:
            self.refuse(node, f"the name {node.id!r} (a JavaScript word)")
        return node.id

    def function(self, node):
        args = node.args
        if args.vararg or args.kwarg or args.kwonlyargs or args.posonlyargs or node.decorator_list:
            self.refuse(node, "*args, **kwargs, keyword-only arguments or a decorator")
        defaults = [None] * (len(args.args) - len(args.defaults)) + args.defaults
        params = [self.name_of(ast.Name(a.arg, lineno=node.lineno))
                  + ("" if d is None else f" = {self.expr(d)}") for a, d in zip(args.args, defaults)]
        body = node.body[1:] if node.body and is_docstring(node.body[0]) else node.body
        if node.body and is_docstring(node.body[0]):
            self.lines.append("// " + node.body[0].value.value.strip().splitlines()[0])
        self.lines.append(f"function {self.name_of(ast.Name(node.name, lineno=node.lineno))}({', '.join(params)}) {{")
        # Python's names live in the whole function: declared once, at its top.
        local = sorted({n.id for n in ast.walk(node) if isinstance(n, ast.Name)
                        and isinstance(n.ctx, ast.Store)} - {a.arg for a in args.args})
        if local:
            self.lines.append(f"  let {', '.join(local)};")
        self.block(body, 1)
        self.lines.append("}")

    def block(self, statements, depth):
        for node in statements:
            self.statement(node, "  " * depth, depth)

    def statement(self, node, pad, depth):
        emit = self.lines.append
        if isinstance(node, ast.Assign):
            if len(node.targets) != 1 or not isinstance(node.targets[0], (ast.Name, ast.Subscript)):
                self.refuse(node, "an assignment to several targets or a tuple")
            emit(f"{pad}{self.expr(node.targets[0])} = {bare(self.expr(node.value))};")
        elif isinstance(node, ast.AugAssign):
            target = self.expr(node.target)
            if isinstance(node.op, ast.FloorDiv):
                emit(f"{pad}{target} = floorDiv({target}, {self.expr(node.value)});")
            elif type(node.op) in OPERATORS:
                emit(f"{pad}{target} {OPERATORS[type(node.op)]}= {bare(self.expr(node.value))};")
            else:
                self.refuse(node, f"the operator {type(node.op).__name__}=")
        elif isinstance(node, ast.If):
            emit(f"{pad}if ({bare(self.expr(node.test))}) {{")
            self.block(node.body, depth + 1)
            if node.orelse:
                emit(f"{pad}}} else {{")
                self.block(node.orelse, depth + 1)
            emit(f"{pad}}}")
        elif isinstance(node, ast.For):
            self.loop(node, pad, depth)
        elif isinstance(node, ast.Return):
            emit(f"{pad}return" + ("" if node.value is None else f" {bare(self.expr(node.value))}") + ";")
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            emit(f"{pad}{self.expr(node.value)};")
        else:
            self.refuse(node, f"a statement {type(node).__name__}")

    def loop(self, node, pad, depth):
        if node.orelse or not isinstance(node.target, ast.Name):
            self.refuse(node, "a for loop with an else, or over tuples")
        name = self.name_of(node.target)
        it = node.iter
        if isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "range":
            if it.keywords or not 1 <= len(it.args) <= 3:
                self.refuse(node, "range() with keywords, or without 1 to 3 arguments")
            start, stop = (["0", self.expr(it.args[0])] if len(it.args) == 1
                           else [self.expr(it.args[0]), self.expr(it.args[1])])
            step = 1 if len(it.args) < 3 else literal_int(it.args[2])
            if step is None or step == 0:
                self.refuse(node, "range() with a step that is not a nonzero number")
            # the stop is evaluated once, as Python's range() does
            self.lines.append(f"{pad}for (let {name}$stop = {stop}, {name}$i = {start}; "
                              f"{name}$i {'<' if step > 0 else '>'} {name}$stop; {name}$i += {step}) {{")
            self.lines.append(f"{pad}  {name} = {name}$i;")
        else:
            self.lines.append(f"{pad}for ({name} of {self.expr(it)}) {{")
        self.block(node.body, depth + 1)
        self.lines.append(f"{pad}}}")

    def expr(self, node):
        if isinstance(node, ast.Constant):
            value = node.value
            if value is None or isinstance(value, bool):
                return {None: "null", True: "true", False: "false"}[value]
            if isinstance(value, int) and abs(value) < 2**53:
                return str(value)
            if isinstance(value, str):
                return json.dumps(value)
            self.refuse(node, f"the constant {value!r} (only ints below 2**53, strings, booleans)")
        if isinstance(node, ast.Name):
            return self.name_of(node)
        if isinstance(node, ast.List):
            return "[" + ", ".join(self.expr(e) for e in node.elts) + "]"
        if isinstance(node, ast.Dict):
            if not all(isinstance(k, ast.Constant) and isinstance(k.value, str) for k in node.keys):
                self.refuse(node, "a dict whose keys are not strings")
            return "{" + ", ".join(f"{json.dumps(k.value)}: {self.expr(v)}"
                                   for k, v in zip(node.keys, node.values)) + "}"
        if isinstance(node, ast.Subscript):
            if isinstance(node.slice, ast.Slice) or literal_int(node.slice) is not None and literal_int(node.slice) < 0:
                self.refuse(node, "a slice or a negative index")
            return f"{self.expr(node.value)}[{self.expr(node.slice)}]"
        if isinstance(node, ast.BinOp):
            left, right = self.expr(node.left), self.expr(node.right)
            if isinstance(node.op, ast.FloorDiv):
                return f"floorDiv({left}, {right})"
            if type(node.op) not in OPERATORS:
                self.refuse(node, f"the operator {type(node.op).__name__}")
            return f"({left} {OPERATORS[type(node.op)]} {right})"
        if isinstance(node, ast.UnaryOp):
            if isinstance(node.op, ast.USub):
                return f"(-{self.expr(node.operand)})"
            if isinstance(node.op, ast.Not):
                return f"(!{self.expr(node.operand)})"
            self.refuse(node, f"the operator {type(node.op).__name__}")
        if isinstance(node, ast.BoolOp):
            joiner = " && " if isinstance(node.op, ast.And) else " || "
            return "(" + joiner.join(self.expr(v) for v in node.values) + ")"
        if isinstance(node, ast.Compare):
            if len(node.ops) != 1 or type(node.ops[0]) not in COMPARISONS:
                self.refuse(node, "a chained comparison, `in` or `is`")
            return f"({self.expr(node.left)} {COMPARISONS[type(node.ops[0])]} {self.expr(node.comparators[0])})"
        if isinstance(node, ast.Call):
            return self.call(node)
        self.refuse(node, f"an expression {type(node).__name__}")

    def call(self, node):
        if node.keywords:
            self.refuse(node, "a call with keyword arguments")
        args = [self.expr(a) for a in node.args]
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "append" and len(args) == 1:
            return f"{self.expr(func.value)}.push({args[0]})"
        if isinstance(func, ast.Name) and func.id == "len" and len(args) == 1:
            return f"{args[0]}.length"
        if isinstance(func, ast.Name) and func.id in self.known:
            return f"{func.id}({', '.join(args)})"
        self.refuse(node, f"a call of {ast.unparse(func)}()")


def bare(text):
    """An expression without the parentheses around the whole of it, where it stands alone."""
    depth, quoted, escaped = 0, False, False
    for index, char in enumerate(text):
        if quoted:   # a string literal's parentheses are not the expression's
            quoted, escaped = (escaped or char != '"'), (not escaped and char == "\\")
            continue
        quoted = char == '"'
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0 and index < len(text) - 1:
            return text   # the first parenthesis closes before the end: not one group
    return text[1:-1] if text.startswith("(") and text.endswith(")") else text


def is_docstring(node):
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def literal_int(node):
    """The value of an int literal, or of minus one; None for anything else."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = literal_int(node.operand)
        return None if inner is None else -inner
    return None


def transpile(sources):
    """{name: Python source} -> one JavaScript script (the modules share one scope)."""
    trees = {name: ast.parse(text, name) for name, text in sources.items()}
    known = {n.name for tree in trees.values() for n in tree.body if isinstance(n, ast.FunctionDef)}
    parts = [PRELUDE]
    for name, tree in trees.items():
        parts.append(f"// ---- {name}, turned into JavaScript by ddp_scripts/fit/tojs.py ----")
        parts += Module(tree, name, known).lines
    return "\n".join(parts) + "\n"


def transpile_files(paths):
    return transpile({Path(p).name: Path(p).read_text(encoding="utf-8") for p in paths})
