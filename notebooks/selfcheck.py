"""Self-checks for the chapters' exercises: tell a student whether an answer is right,
without the answer being readable in the notebook.

A self-check cell holds the answer only as a salted hash (the "digest"):

    from notebooks.selfcheck import check
    check(needs_gpu, "ch01-ex-needs-gpu:4c1f...", hint="Which lines create or move a tensor?")

`check` hashes the student's answer the same way and compares. The salt is the label in
front of the colon (the exercise's label), so two exercises with the same answer have
different digests. An instructor makes the digest of a new check with

    python -m notebooks.selfcheck ch01-ex-needs-gpu '{"b", "d"}'

(run from the repository root; the answer is a Python literal) or `digest(label, answer)`.
A digest does not stop a determined student from trying every small answer, and it is not
meant to: it keeps the answer out of sight of one who reads the cell before trying.

Only the notebooks use this module; it lives beside them (as `notebooks/selfcheck.py`, imported
as `notebooks.selfcheck` once the set-up cell has installed the repository's package), and
the student copies carry it.
"""
import ast
import hashlib
import json
import os
import re
import sys
from pathlib import Path

BOOK_SALT = "pytorch-gpu-book self-check"
# What check() says, in each edition's language; the Chinese hints, by the check's label, beside
# the English each translates (a test holds them to the chapters' hints).
SAID = {"en": {"unanswered": "Not answered yet: set {name} and run the cells again.",
               "right": "{name}: right.", "wrong": "{name}: not quite. {hint}"},
        "zh": {"unanswered": "还没有作答：先设置 {name}，再运行这些单元格。",
               "right": "{name}：正确。", "wrong": "{name}：还不对。{hint}"}}
HINTS_ZH = Path(__file__).with_name("selfcheck_zh.json")


def canonical(answer, places=None):
    """The answer as one text, the same for equal answers: {"d", "b"} and {"b", "d"},
    (2, 1) and [2, 1], 24 and 24.0 all read alike. Numbers are rounded to `places` decimals
    when given, so that 0.8749999 and 0.875 agree to two places."""
    if isinstance(answer, bool):
        return json.dumps(answer)
    if isinstance(answer, (set, frozenset)):
        return "[" + ",".join(sorted(canonical(item, places) for item in answer)) + "]"
    if isinstance(answer, (list, tuple)):
        return "[" + ",".join(canonical(item, places) for item in answer) + "]"
    if isinstance(answer, dict):
        return "{" + ",".join(f"{canonical(k, places)}:{canonical(v, places)}"
                              for k, v in sorted(answer.items(), key=lambda kv: str(kv[0]))) + "}"
    if hasattr(answer, "item") and callable(answer.item):  # a one-element tensor or numpy value
        answer = answer.item()
    if isinstance(answer, (int, float)):
        if places is not None:
            return f"{round(float(answer), places):.{places}f}"
        if float(answer).is_integer():
            return str(int(answer))
        return repr(float(answer))
    return json.dumps(str(answer).strip())


def digest(label, answer, places=None):
    """The digest that `check` compares with: 'LABEL:' and 16 hex digits of a salted SHA-256."""
    text = f"{BOOK_SALT}|{label}|{canonical(answer, places)}"
    return f"{label}:{hashlib.sha256(text.encode()).hexdigest()[:16]}"


def is_right(answer, expected_digest, places=None):
    """True when `answer` hashes to `expected_digest`. With `places`, an answer within one
    unit of the last place also counts (0.874 for 0.875 at two places)."""
    label = expected_digest.split(":", 1)[0]
    candidates = [answer]
    if places is not None and isinstance(answer, (int, float)) and not isinstance(answer, bool):
        step = 10 ** -places
        candidates += [answer - step, answer + step]
    return any(digest(label, candidate, places) == expected_digest for candidate in candidates)


def check(answer, expected_digest, hint="", name="answer", places=None, case=None):
    """Print whether `answer` is right, never what the right answer is.

    expected_digest  from `digest(label, right_answer)`; or a dict of them when the right
                     answer depends on the machine, with `case` saying which one applies
    hint             printed when the answer is not right
    name             what the student set, for the message ("needs_gpu")
    places           compare numbers rounded to this many decimals
    """
    if isinstance(expected_digest, dict):
        expected_digest = expected_digest[case]
    said, label = SAID[language()], expected_digest.split(":", 1)[0]
    if answer is None or answer == set() or (isinstance(answer, (list, tuple)) and
                                             all(item is None for item in answer)):
        print(said["unanswered"].format(name=name))
    elif is_right(answer, expected_digest, places):
        print(said["right"].format(name=name))
    else:
        hint = translated_hint(label, hint) if language() == "zh" else hint
        print(said["wrong"].format(name=name, hint=hint).rstrip())


def language():
    """'zh' for the Chinese edition's notebooks, else 'en'. BOOK_LANGUAGE=zh (or en) chooses it;
    else the notebook says it: Jupyter names the notebook in JPY_SESSION_NAME, and a Chinese
    notebook's metadata holds "book_edition": "zh", wherever it was uploaded (Kaggle, ModelScope,
    a lab's server); else a notebook in a folder named zh (Jupyter starts the kernel in the
    notebook's folder) is Chinese. Where none of these holds (Colab), set BOOK_LANGUAGE."""
    chosen = os.environ.get("BOOK_LANGUAGE", "")
    if chosen in SAID:
        return chosen
    session = os.environ.get("JPY_SESSION_NAME", "")
    said = notebook_edition(session) if session else None
    if said in SAID:
        return said
    places = [session, os.getcwd()]
    return "zh" if any(Path(place).parent.name == "zh" or Path(place).name == "zh"
                       for place in places if place) else "en"


def notebook_edition(session):
    """The book_edition in the metadata of the notebook Jupyter named (its path, or its name in
    the kernel's folder); None if there is no such notebook."""
    for path in (Path(session), Path.cwd() / Path(session).name):
        try:
            return json.loads(path.read_text(encoding="utf-8"))["metadata"].get("book_edition")
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    return None


def translated_hint(label, hint):
    """The Chinese hint for the check `label`, with the values the English one was given
    ({gpus} in 'a machine with {gpus} GPU(s)'); the English hint if none fits."""
    entry = json.loads(HINTS_ZH.read_text(encoding="utf-8")).get(label) if HINTS_ZH.exists() else None
    if not entry:
        return hint
    pattern = re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>.+?)", re.escape(entry["en"]))
    found = re.fullmatch(pattern, hint)
    return entry["zh"].format(**found.groupdict()) if found else hint


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) not in (2, 3):
        print("usage: python -m notebooks.selfcheck LABEL ANSWER [PLACES]  "
              "(ANSWER a Python literal)", file=sys.stderr)
        return 2
    places = int(argv[2]) if len(argv) == 3 else None
    print(digest(argv[0], ast.literal_eval(argv[1]), places))
    return 0


if __name__ == "__main__":
    sys.exit(main())
