#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The size limits of include/ulysses (issue 29, docs/testing.md "Source checks").

Reports every header over 450 lines, every function over 60 lines (from its signature line to
its closing brace; lambdas and local classes count toward the function that holds them) and
every @file comment over 12 lines. Exits 1 on a violation that the allow-list does not name.

  python3 limits.py ROOT [--allow FILE]   # ROOT: include/ulysses
  python3 limits.py --self-test           # the checker on sources with known violations

The allow-list names the violations that are known and owned elsewhere, one a line, to be
removed as they are fixed ('#' starts a comment):
  lines    comm/mpi_window.hpp
  function comm/mpi_window.hpp MpiWindow::MpiWindow
  file     comm/concepts.hpp
An entry that no longer matches is printed as stale (remove it), and does not fail the check.

The function finder is a heuristic over C++ text, not a parser: comments, strings and
preprocessor lines are blanked first; then a '{' at namespace or class scope opens a function
body when the text since the previous ';', '{' or '}' ends in a parameter list (with its
qualifiers, a trailing return type or a constructor's initialiser list).
"""

import re
import sys
from pathlib import Path

MAX_HEADER_LINES = 450
MAX_FUNCTION_LINES = 60
MAX_FILE_COMMENT_LINES = 12

CONTROL = {"if", "for", "while", "switch", "catch", "do", "else", "try", "return"}


def blank_comments_and_strings(text):
    """The text with comments, string and character literals and preprocessor lines replaced by
    spaces (newlines kept), so that braces and parentheses in them do not count."""
    out = []
    i, n = 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if line_start and c == "#" or (line_start and c in " \t" and text[i:].lstrip(" \t").startswith("#")):
            # A preprocessor line, with its continuations.
            j = i
            while j < n:
                k = text.find("\n", j)
                if k == -1:
                    k = n
                if k > 0 and text[k - 1] == "\\":
                    j = k + 1
                    continue
                break
            out.append("".join("\n" if ch == "\n" else " " for ch in text[i:k]))
            i = k
            continue
        if text.startswith("//", i):
            k = text.find("\n", i)
            k = n if k == -1 else k
            out.append(" " * (k - i))
            i = k
            continue
        if text.startswith("/*", i):
            k = text.find("*/", i + 2)
            k = n if k == -1 else k + 2
            out.append("".join("\n" if ch == "\n" else " " for ch in text[i:k]))
            i = k
            line_start = False
            continue
        m = re.match(r'(?:u8|u|U|L)?R"([^(\s]{0,16})\(', text[i:i + 24]) if c in 'uULR' else None
        if m and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            end = text.find(")" + m.group(1) + '"', i + m.end())
            k = n if end == -1 else end + len(m.group(1)) + 2
            out.append("".join("\n" if ch == "\n" else " " for ch in text[i:k]))
            i = k
            continue
        if c in "\"'":
            # A digit separator (1'000) is not a character literal.
            if c == "'" and i > 0 and text[i - 1].isalnum() and i + 1 < n and text[i + 1].isalnum():
                out.append(" ")
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            k = min(j + 1, n)
            out.append(" " * (k - i))
            i = k
            line_start = False
            continue
        out.append(c)
        line_start = c == "\n"
        i += 1
    return "".join(out)


def strip_template_heads(decl):
    """decl without its leading `template <...>` clauses."""
    while True:
        m = re.match(r"\s*template\s*<", decl)
        if not m:
            return decl
        depth, j = 1, m.end()
        while j < len(decl) and depth:
            if decl[j] == "<":
                depth += 1
            elif decl[j] == ">":
                depth -= 1
            elif decl[j] == "(":  # (a > b) inside a template head
                close = decl.find(")", j)
                j = close if close != -1 else j
            j += 1
        decl = decl[j:]


QUALIFIERS = re.compile(
    r"\)\s*(?:(?:const|volatile|noexcept|override|final|mutable|&&|&|throw\s*\(\s*\))\s*"
    r"|noexcept\s*\([^;{}]*\)\s*)*(?:->[^;{}]*)?(?:requires[^;{}]*)?$")
CTOR_INIT = re.compile(r"\)\s*(?:noexcept\s*)?:(?!:)")
CLASS_HEAD = re.compile(r"^\s*(?:\w+\s+)*?(class|struct|union|enum)\b")


def function_name(decl):
    """The name of the function declared by decl: the identifier (with its qualification) before
    the parameter list."""
    decl = strip_template_heads(decl)
    decl = re.sub(r"__attribute__\s*\(\((?:[^()]|\([^()]*(?:\([^()]*\)[^()]*)*\))*\)\)|\[\[[^\]]*\]\]|__launch_bounds__\s*\([^()]*\)|alignas\s*\([^()]*\)", " ", decl)
    m = re.search(r"(operator\s*(?:\(\)|\[\]|[^\s(]+)|~?[A-Za-z_]\w*(?:\s*<[^()]*>)?(?:\s*::\s*~?\w+)*)\s*\(", decl)
    if not m:
        return "?"
    name = re.sub(r"\s+", "", m.group(1))
    # Qualified names keep their qualification, template arguments go.
    return re.sub(r"<[^<>]*>", "", name)


def find_functions(code):
    """(name, first line, last line) of every function body at namespace or class scope of code
    (comments and strings already blanked). Lines are 1-based."""
    functions = []
    stack = []  # per open brace: 'ns', 'class', 'func', 'init' (a brace of a ctor's initialiser), 'other'
    decl_start = 0  # offset of the text since the previous ';', '{' or '}' at this scope
    func_start = None  # (name, line) of the open function
    line_of = _line_index(code)
    i, n = 0, len(code)
    while i < n:
        c = code[i]
        in_body = any(s == "func" for s in stack)
        if c == "{":
            if in_body:
                stack.append("other")
            else:
                decl = code[decl_start:i]
                kind = classify(decl)
                if kind == "func":
                    name = function_name(decl)
                    first = decl_start + (len(decl) - len(decl.lstrip()))
                    # Skip the template head's lines: the signature line is the name's.
                    body = strip_template_heads(decl)
                    first = decl_start + len(decl) - len(body) + (len(body) - len(body.lstrip()))
                    first = _skip_access(code, first)
                    func_start = (name, line_of(first))
                stack.append(kind)
                if kind != "init":
                    decl_start = i + 1
            i += 1
            continue
        if c == "}":
            kind = stack.pop() if stack else "other"
            if kind == "func":
                name, first = func_start
                functions.append((name, first, line_of(i)))
            if not any(s == "func" for s in stack) and kind != "init":
                decl_start = i + 1
            i += 1
            continue
        if c == ";" and not in_body and not (stack and stack[-1] == "init"):
            decl_start = i + 1
        i += 1
    return functions


def _skip_access(code, pos):
    m = re.match(r"\s*(?:(?:public|private|protected)\s*:\s*)+", code[pos:])
    if m:
        pos += m.end()
    while pos < len(code) and code[pos].isspace():
        pos += 1
    return pos


def classify(decl):
    """What a '{' at namespace or class scope opens, from the text before it."""
    text = re.sub(r"^\s*(?:(?:public|private|protected)\s*:\s*)+", "", decl)
    text = strip_template_heads(text).strip()
    if re.match(r"^(?:inline\s+)?namespace\b", text) or re.match(r"^extern\s*$", text) or text == "":
        return "ns" if text else "other"
    # Inside a constructor's initialiser list, a brace after a member's name initialises it.
    if CTOR_INIT.search(text) and re.search(r"[\w>]\s*$", text) and "(" in text:
        head = text[:CTOR_INIT.search(text).start()]
        if "=" not in _depth0(head):
            return "init"
    m = CLASS_HEAD.match(text)
    if m and "(" not in text[:m.start(1)] and "=" not in _depth0(text):
        return "class"
    if "(" not in text:
        return "other"
    first_word = re.match(r"\w+", text)
    if first_word and first_word.group(0) in CONTROL:
        return "other"
    if "=" in _depth0(text.split("(")[0]) and not re.search(r"\boperator\b", text):
        # `auto f = [](...) {` at namespace scope: a lambda bound to a name counts as a function;
        # `T x = T(...) {`-like initialisers do not occur at these scopes.
        return "func" if re.search(r"\]\s*(?:<[^>]*>\s*)?\([^;]*\)[^;]*$", text) else "other"
    if QUALIFIERS.search(text):
        return "func"
    if CTOR_INIT.search(text) and re.search(r"[)}]\s*$", text):
        return "func"
    return "other"


def _depth0(text):
    """text with everything inside (), [], {} and <> removed."""
    out, depth = [], 0
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth = max(0, depth - 1)
        elif depth == 0:
            out.append(ch)
    return "".join(out)


def _line_index(code):
    starts = [0]
    for m in re.finditer("\n", code):
        starts.append(m.end())
    import bisect

    return lambda pos: bisect.bisect_right(starts, pos)


def file_comment_lines(text):
    """The length in lines of the comment block that holds `@file`, or 0 when there is none."""
    lines = text.split("\n")
    for idx, line in enumerate(lines):
        if "@file" not in line:
            continue
        s = line.strip()
        if s.startswith("//"):
            lo = idx
            while lo > 0 and lines[lo - 1].strip().startswith("///"):
                lo -= 1
            hi = idx
            while hi + 1 < len(lines) and lines[hi + 1].strip().startswith("//"):
                hi += 1
            return hi - lo + 1
        # A /** ... */ block.
        lo = idx
        while lo > 0 and "/*" not in lines[lo]:
            lo -= 1
        hi = idx
        while hi < len(lines) and "*/" not in lines[hi]:
            hi += 1
        return hi - lo + 1
    return 0


def check_file(rel, text):
    """The violations of one header: (kind, rel, name, detail)."""
    found = []
    n_lines = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
    if n_lines > MAX_HEADER_LINES:
        found.append(("lines", rel, "", f"{n_lines} lines (at most {MAX_HEADER_LINES})"))
    for name, first, last in find_functions(blank_comments_and_strings(text)):
        length = last - first + 1
        if length > MAX_FUNCTION_LINES:
            found.append(("function", rel, name, f"lines {first}-{last}: {length} lines (at most {MAX_FUNCTION_LINES})"))
    fc = file_comment_lines(text)
    if fc > MAX_FILE_COMMENT_LINES:
        found.append(("file", rel, "", f"@file comment of {fc} lines (at most {MAX_FILE_COMMENT_LINES})"))
    return found


def read_allow(path):
    entries = []
    if not path:
        return entries
    for raw in Path(path).read_text().split("\n"):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        kind, rel = parts[0], parts[1]
        name = parts[2] if len(parts) > 2 else ""
        if kind not in ("lines", "function", "file"):
            raise SystemExit(f"limits: {path}: unknown kind '{kind}' in: {raw}")
        entries.append((kind, rel, name))
    return entries


def check_tree(root, allow_path):
    root = Path(root)
    headers = sorted(p for p in root.rglob("*") if p.suffix in (".hpp", ".cuh", ".h"))
    violations = []
    for p in headers:
        violations += check_file(p.relative_to(root).as_posix(), p.read_text(encoding="utf-8"))
    allow = read_allow(allow_path)
    used = set()
    failing = []
    for v in violations:
        key = (v[0], v[1], v[2])
        if key in allow:
            used.add(key)
            print(f"allowed:   {v[1]}: {v[0]} {v[2]} {v[3]}".replace("  ", " "))
        else:
            failing.append(v)
    for key in allow:
        if key not in used:
            print(f"stale allow-list entry (remove it from {allow_path}): {' '.join(k for k in key if k)}")
    for v in failing:
        print(f"VIOLATION: {v[1]}: {v[0]} {v[2]} {v[3]}".replace("  ", " "))
    print(f"limits: {len(headers)} headers, {len(violations)} violations, {len(violations) - len(failing)} allowed, "
          f"{len(failing)} not allowed")
    return 1 if failing else 0


SELF_TEST = {
    "long.hpp": "// a\n" * 451,
    "short.hpp": "// a\n" * 450,
    "comment.hpp": "// SPDX\n/// @file\n" + "/// text\n" * 12 + "#pragma once\n",
    "comment_ok.hpp": "// SPDX\n/// @file\n" + "/// text\n" * 10 + "#pragma once\n",
    "functions.hpp": (
        "namespace ulysses {\n"
        "template <class T>\n"
        "__attribute__((target(\"avx2\"))) inline void long_one(T x) {\n" + "  x += 1;\n" * 59 + "}\n"           # 61 lines
        "inline int short_one(int x) noexcept {\n" + "  x += 1;\n" * 58 + "  return x; }\n"  # 60 lines
        "struct S : Base {\n"
        "  S(int a) : a_(a), b_{a} {\n" + "    auto f = [&](int y) { if (y) { a_ += y; } };\n" * 59 + "  }\n"  # 61
        "  int a_; int b_;\n"
        "  const char* s = \"{{{\";  // }}}\n"
        "  auto get() const -> int {\n" + "    return a_;\n" * 10 + "  }\n"
        "};\n"
        "}  // namespace ulysses\n"),
}


def self_test():
    expected = {
        ("lines", "long.hpp", ""),
        ("file", "comment.hpp", ""),
        ("function", "functions.hpp", "long_one"),
        ("function", "functions.hpp", "S"),
    }
    found = set()
    for rel, text in SELF_TEST.items():
        found |= {(k, r, name) for k, r, name, _ in check_file(rel, text)}
    names = {f[0] for f in find_functions(blank_comments_and_strings(SELF_TEST["functions.hpp"]))}
    ok = found == expected and names == {"long_one", "short_one", "S", "get"}
    print(f"limits self-test: found {sorted(found)}, functions {sorted(names)}: {'OK' if ok else 'WRONG'}")
    return 0 if ok else 1


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
    if len(argv) not in (2, 4) or (len(argv) == 4 and argv[2] != "--allow"):
        print(__doc__)
        return 2
    return check_tree(argv[1], argv[3] if len(argv) == 4 else None)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
