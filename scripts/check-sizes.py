#!/usr/bin/env python3
"""crun's size limits, a style guard beside scripts/format.sh and scripts/check-layers.sh:
no production file over 600 lines (agent/local_agent.cc: 300), and no production function over
80 lines but the named EXEMPT below. Production: the .cc .h .cu .py .proto files git tracks
outside tests/ docs/ cmake/ packaging/ scripts/. A file counts its physical lines; a C++
function from its name's line to its closing brace, a Python one from `def` to its last line,
lambdas, blocks and nested defs inside included (a nested def also counts on its own).
C++ functions come from a token scanner (comments, literals and preprocessor lines dropped;
namespaces and extern "C" see-through; classes, structs and unions scopes of inline methods),
named as written inside their classes (`Engine::OnJoin`, `AgentMetrics::AgentMetrics`); Python
ones from the ast module, named `module.func`, `Class.method`, `module.func.inner`. EXEMPT,
KNOWN_OVER and KNOWN_LONG_FILES match that whole name (or path) exactly, in any file.

  python3 scripts/check-sizes.py        exits 1 naming each offender (`path:line: ... is N
                                        lines, over the limit of M`)
  python3 scripts/check_sizes_test.py   tests the scanners

KNOWN_OVER and KNOWN_LONG_FILES are temporary: today's offenders, taken off as a refactor
shortens them. An entry within its limit again, or gone, fails the check, and so does one that
grew past its listed size: the lists and their entries only shrink."""
import ast
import os
import re
import subprocess
import sys

ROOT = os.path.realpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
EXTENSIONS = (".cc", ".h", ".cu", ".py", ".proto")
NOT_PRODUCTION = ("tests/", "docs/", "cmake/", "packaging/", "scripts/")
FILE_LIMIT = 600
FILE_LIMITS = {"agent/local_agent.cc": 300}  # path -> its own limit
FUNCTION_LIMIT = 80

# Functions that may stay over the limit: name -> why.
EXEMPT = {
    "AddLaunchOptions": "the option table: one entry a flag, read as a table",
    "Session::Handle": "the store protocol's switch: one case a request",
}

# ---- TEMPORARY: today's offenders, taken off as the refactor shortens them. ----
# Both empty since the architecture pass of issue 76: keep them so. A new entry needs a reason in
# its commit and an issue that takes it off.
KNOWN_OVER = {}  # function -> its length when listed
KNOWN_LONG_FILES = {}  # path -> its lines when listed
# ---- end of TEMPORARY ----

_LITERAL = re.compile(r"""(?:u8|u|U|L)?(?:"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*')""")
_RAW = re.compile(r'(?:u8|u|U|L)?R"([^()\\\s]{0,16})\(')
_WORD = re.compile(r"[A-Za-z_]\w*|\.?\d(?:[eEpP][+-]|'?[\w.])*")
_PUNCT = ("::", "->", "...", "&&", "||", "==", "!=", "<=", ">=")
_OPEN = {"(": ")", "[": "]", "{": "}"}
_NOT_NAMES = {"decltype", "alignas", "alignof", "sizeof", "typeid", "noexcept", "throw",
              "static_assert", "__attribute__", "__declspec", "if", "for", "while", "switch",
              "return", "catch"}
_QUALIFIERS = {"const", "volatile", "noexcept", "throw", "override", "final", "try", "&", "&&"}
_ACCESS = (["public"], ["protected"], ["private"])
_MACRO = re.compile(r"[A-Z][A-Z0-9_]*$")


def tokens(text):
    """[(token, line)] of C++ text: comments and preprocessor lines dropped, each string or char
    literal (raw strings too) one token '""'."""
    out, i, line, bol, n = [], 0, 1, True, len(text)
    while i < n:
        c, start = text[i], i
        if c in " \t\r\f\v\n" or text.startswith("\\\n", i):
            bol, i = bol or c == "\n", i + (2 if c == "\\" else 1)
        elif bol and c == "#":  # a directive, to the end of its last continued line
            i = i + 1
            while i < n and text[i] != "\n":
                i += 2 if text.startswith("\\\n", i) else 1
        elif text.startswith("//", i):
            i = text.find("\n", i) % (n + 1)
        elif text.startswith("/*", i):
            i = text.find("*/", i + 2) % (n + 1) + 2
        else:
            bol, raw = False, _RAW.match(text, i)
            m = None if raw else _LITERAL.match(text, i) or _WORD.match(text, i)
            if raw:
                i = text.find(")" + raw.group(1) + '"', raw.end()) % (n + 1) + len(raw.group(1)) + 2
            else:
                i = m.end() if m else i + next((len(p) for p in _PUNCT if text.startswith(p, i)), 1)
            tok = '""' if raw or (m and m.group()[-1] in "\"'") else text[start:i]
            out.append((tok, line))
        line += text.count("\n", start, min(i, n))
    return out


def _matches(toks):
    """{index of an opening (, [ or {: index of its closing one}; ValueError where unbalanced."""
    match, stack = {}, []
    for k, (t, line) in enumerate(toks):
        if t in _OPEN:
            stack.append(k)
        elif t in (")", "]", "}"):
            if not stack or _OPEN[toks[stack[-1]][0]] != t:
                raise ValueError(f"unbalanced {t!r} at line {line}")
            match[stack.pop()] = k
    if stack:
        raise ValueError(f"unclosed {toks[stack[-1]][0]!r} at line {toks[stack[-1]][1]}")
    return match


def cpp_functions(text):
    """[(name, first_line, last_line)] of each function defined in C++ text."""
    toks, found = tokens(text), []
    _scope(toks, _matches(toks), 0, len(toks), "", found)
    return found


def _scope(toks, match, i, end, prefix, found):
    """Adds to found the functions between toks[i] and toks[end], in a scope named prefix."""
    stmt = []  # the declaration so far: token indices, a group as its opening one
    while i < end:
        t, words = toks[i][0], [toks[k][0] for k in stmt]
        if t == ";" or (t == ":" and words in _ACCESS):
            stmt, i = [], i + 1
        elif t != "{":
            stmt.append(i)
            i = match.get(i, i) + 1
        elif "namespace" in words or words == ["extern", '""']:
            _scope(toks, match, i + 1, match[i], prefix, found)
            stmt, i = [], match[i] + 1
        else:
            kind, name, first = _declaration(toks, stmt)
            if kind == "function":
                last = match[i]
                while last + 2 < end and toks[last + 1][0] == "catch":  # function-try-block
                    last = match[match[last + 2] + 1]
                found.append((prefix + name, toks[first][1], toks[last][1]))
                stmt, i = [], last + 1
                continue
            if kind == "class":
                _scope(toks, match, i + 1, match[i], prefix + (name and name + "::"), found)
            stmt.append(i)  # an initializer, enum or class body: the declaration goes on
            i = match[i] + 1


def _declaration(toks, stmt):
    """("function", name, index of its first token), ("class", name, None) or ("block",...) for
    the declaration stmt that a { follows."""
    w, s = [toks[k][0] for k in stmt], 0
    while w[s:s + 2] == ["template", "<"]:  # template <...> headers
        depth, s = 0, s + 1
        while s < len(w) and (depth := depth + (w[s] == "<") - (w[s] == ">")) > 0:
            s += 1
        s += 1
    w = w[s:]
    if "=" in w and "operator" not in w[:w.index("=")]:
        return "block", None, None  # an initializer, or a lambda's
    for p, t in enumerate(w):
        if t != "(":
            continue
        if "operator" in w[:p]:
            o = w.index("operator")
            if p == o + 1:  # operator()'s own parentheses
                continue
            rest = "".join("()" if x == "(" else x for x in w[o + 1:p])
            name = "operator" + (" " if rest[:1].isalpha() else "") + rest
        elif p == 0 or not _WORD.match(w[p - 1]) or w[p - 1] in _NOT_NAMES:
            continue
        else:
            o, name = p - 1, w[p - 1]
        tail = _tail(w[p + 1:])
        if tail == "block":
            return "block", None, None
        if tail:
            o, name = _qualifiers(w, o, name)
            return "function", name, stmt[s + o]
    for k, t in enumerate(w):
        if t in ("class", "struct", "union") and "enum" not in w[:k]:
            words = []
            for x in w[k + 1:]:
                if x in ("<", ":", "final"):
                    break
                words += [x] if _WORD.match(x) else []
            return "class", words[-1] if words else "", None
    return "block", None, None


def _tail(w):
    """Whether w, what follows a parameter list, can precede a body: qualifiers, attributes,
    a trailing return type or a constructor's initializers; "block" where w is initializers
    that the { continues (`b_{y}`)."""
    j = 0
    while j < len(w):
        if w[j] == "->":
            return True
        if w[j] == ":":
            return bool(w[j + 1:]) and (w[-1] in ("(", "{") or "block")
        if w[j] in _QUALIFIERS or w[j] == "[" or _MACRO.match(w[j]):
            j += 2 if w[j + 1:j + 2] == ["("] else 1
            continue
        return False
    return True


def _qualifiers(w, o, name):
    """(index of the first word, name as written) of the name ending at w[o]: `A<T>::B::~C`."""
    if o > 0 and w[o - 1] == "~":
        o, name = o - 1, "~" + name
    while o > 1 and w[o - 1] == "::":
        o -= 2
        depth = 0
        while o > 0 and (depth := depth + (w[o] == ">") - (w[o] == "<")) > 0 or w[o] == "<":
            o -= 1  # past template arguments
        name = w[o] + "::" + name
    return o, name


def py_functions(text, module):
    """[(name, first_line, last_line)] of each def in Python text, methods and nested ones."""
    found = []

    def visit(node, prefix, inside):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append((prefix + child.name, child.lineno, child.end_lineno))
                visit(child, prefix + child.name + ".", True)
            elif isinstance(child, ast.ClassDef):
                visit(child, (prefix if inside else "") + child.name + ".", True)
            else:
                visit(child, prefix, inside)

    visit(ast.parse(text), module + ".", False)
    return found


def production_files(root=ROOT):
    """The production files git tracks under root, as paths relative to it."""
    listed = subprocess.run(["git", "-C", root, "ls-files"], check=True, capture_output=True,
                            text=True).stdout.split("\n")
    return [f for f in listed if f.endswith(EXTENSIONS) and not f.startswith(NOT_PRODUCTION)
            and os.path.isfile(os.path.join(root, f))]


def stale(list_name, known, measured, limit_of):
    """What is wrong with a temporary list: an entry within its limit again (or gone), or one
    that grew past its listed size."""
    errors = []
    for name, listed in known.items():
        now, limit = measured.get(name, 0), limit_of(name)
        if now <= limit:
            errors.append(f"check-sizes.py: {list_name}'s {name} is {now} lines now (0: gone), "
                          f"within {limit}: take it off the list")
        elif now > listed:
            errors.append(f"check-sizes.py: {list_name}'s {name} grew to {now} lines, from "
                          f"{listed}: an exception may only shrink")
    return errors


def check(files, read, known_over=None, known_long=None):
    """(errors, files checked, functions checked, temporary entries left) of files, each read by
    read(path); the temporary lists default to the module's."""
    known_over = KNOWN_OVER if known_over is None else known_over
    known_long = KNOWN_LONG_FILES if known_long is None else known_long
    errors, lengths, sizes, count = [], {}, {}, 0
    for path in files:
        text = read(path)
        sizes[path] = text.count("\n") + (not text.endswith("\n") and text != "")
        limit = FILE_LIMITS.get(path, FILE_LIMIT)
        if sizes[path] > limit and path not in known_long:
            errors.append(f"{path}:1: file is {sizes[path]} lines, over the limit of {limit}")
        try:
            functions = (py_functions(text, os.path.basename(path)[:-3]) if path.endswith(".py")
                         else [] if path.endswith(".proto") else cpp_functions(text))
        except (ValueError, SyntaxError) as e:
            errors.append(f"{path}:1: cannot be scanned: {e}")
            continue
        for name, first, last in functions:
            count, n = count + 1, last - first + 1
            lengths[name] = max(lengths.get(name, 0), n)
            if n > FUNCTION_LIMIT and name not in EXEMPT and name not in known_over:
                errors.append(f"{path}:{first}: function {name} is {n} lines, over the limit of "
                              f"{FUNCTION_LIMIT}")
    errors += stale("KNOWN_OVER", known_over, lengths, lambda name: FUNCTION_LIMIT)
    errors += stale("KNOWN_LONG_FILES", known_long, sizes,
                    lambda path: FILE_LIMITS.get(path, FILE_LIMIT))
    return errors, len(files), count, len(known_over) + len(known_long)


def main():
    def read(path):
        with open(os.path.join(ROOT, path), encoding="utf-8", errors="replace") as f:
            return f.read()

    errors, files, functions, left = check(production_files(), read)
    if errors:
        print("\n".join(errors), file=sys.stderr)
        return 1
    print(f"check-sizes.py: {files} files and {functions} functions within limits "
          f"({left} temporary exceptions left)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
