#!/usr/bin/python3
"""Runs the code snippets of the documentation as written.

    run_snippets.py --source-dir S --build-dir B [--mc2 B/tools/mc2]
                    [--python /usr/bin/python3] FILE.md...
    run_snippets.py --source-dir S --build-dir B --readme-commands README.md

The conventions, in the markdown itself (docs/testing.md, "The
documentation's tests"):

- a ```python block is a complete program. It is run on 2 ranks with
  `mc2 run -n 2 /usr/bin/python3 snippet.py`, and, when the line just above
  its fence is `<!-- torchrun too -->`, also under torchrun
  (`python3 -m torch.distributed.run --standalone --nproc_per_node 2 -r 1
  -t 1 snippet.py`);
- `<!-- fragment -->` above a ```python block: it continues the complete
  program just above it; the two run as one program (the fragment's own
  run stands for both);
- `<!-- not run: REASON -->` above a block: not run (the reason is
  required);
- `<!-- run -->` above a ```sh block: run with bash (`set -e`);
- `<!-- file: PATH -->` above any block: the block must equal the file
  PATH of the source tree (an example that the build compiles and the
  suite runs).

Other blocks (C++, cmake, output) are shown, not run. Every snippet runs in
a fresh directory that holds links to the source tree's top-level entries
and `build` -> the build directory, so that `build/tools/mc2`,
`PYTHONPATH=build/python` and `examples/...` work as written; the Python
snippets get PYTHONPATH=build/python.

--readme-commands checks that every `mc2 COMMAND [SUBCOMMAND] --option`
the file shows (in code blocks and inline code) is an option that
`mc2 COMMAND [SUBCOMMAND] --help` lists.

Exits 1 if any snippet fails, naming the file and the line of each failed
snippet's fence, with its output.
"""
import argparse
import os
import re
import shutil
import shlex
import subprocess
import sys
import tempfile
import time

MARK = re.compile(r"^<!--\s*(fragment|torchrun too|run|not run:.*\S.*|file:\s*\S+)\s*-->\s*$")
FENCE = re.compile(r"^```(\S*)\s*$")
SNIPPET_TIMEOUT = 240


class Snippet:
    def __init__(self, path, line, lang, text, marks):
        self.path, self.line, self.lang, self.text, self.marks = path, line, lang, text, marks

    def where(self):
        return f"{self.path}:{self.line}"

    def mark(self, name):
        return any(m == name or m.startswith(name + ":") for m in self.marks)


def parse(path):
    """The fenced blocks of `path`, with the marks in the comment lines just
    above each fence."""
    lines = open(path, encoding="utf-8").read().split("\n")
    snippets, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, lang = i, m.group(1)
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        if j == len(lines):
            raise SystemExit(f"{path}:{start + 1}: unterminated code block")
        marks, k = [], start - 1
        while k >= 0 and MARK.match(lines[k]):
            marks.append(MARK.match(lines[k]).group(1).strip())
            k -= 1
        snippets.append(Snippet(path, start + 1, lang, "\n".join(lines[start + 1:j]) + "\n",
                                marks))
        i = j + 1
    return snippets


def stray_marks(path):
    """Comment lines that look like marks but are not above a fence."""
    lines = open(path, encoding="utf-8").read().split("\n")
    bad = []
    for n, line in enumerate(lines):
        if not re.match(r"^<!--\s*(fragment|torchrun|run|not run|file:)", line):
            continue
        k = n + 1
        while k < len(lines) and MARK.match(lines[k]):
            k += 1
        if not MARK.match(line) or k == len(lines) or not FENCE.match(lines[k]):
            bad.append(f"{path}:{n + 1}: '{line}' is not a mark (fragment, torchrun too, run, "
                       "not run: REASON, file: PATH) just above a code block")
    return bad


def workdir(source, build):
    d = tempfile.mkdtemp(prefix="mc2-snippet-")
    for name in os.listdir(source):
        if name != "build":
            os.symlink(os.path.join(source, name), os.path.join(d, name))
    os.symlink(build, os.path.join(d, "build"))
    return d


def run(cmd, cwd, env):
    """Runs `cmd` in `cwd`: returns (status, output, seconds)."""
    start = time.monotonic()
    try:
        p = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=SNIPPET_TIMEOUT)
        out, status = p.stdout.decode(errors="replace"), p.returncode
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace")
        status = f"timeout after {SNIPPET_TIMEOUT} s"
    return status, out, time.monotonic() - start


def python_runs(snippet, program, args):
    runs = [("mc2 run -n 2", [args.mc2, "run", "-n", "2", args.python, program])]
    if snippet.mark("torchrun too"):
        runs.append(("torchrun", [args.python, "-m", "torch.distributed.run", "--standalone",
                                  "--nproc_per_node", "2", "-r", "1", "-t", "1", program]))
    return runs


def check_snippets(paths, args):
    failures, ran = [], 0
    env = dict(os.environ, PYTHONPATH=os.path.join(args.build_dir, "python"),
               OMP_NUM_THREADS="1")
    env.setdefault("MC2_TIMEOUT", "60s")
    for path in paths:
        failures += stray_marks(path)
        program_above = None
        for s in parse(path):
            if s.mark("not run"):
                continue
            file_marks = [m for m in s.marks if m.startswith("file:")]
            for m in file_marks:
                ref = m.split(":", 1)[1].strip()
                try:
                    text = open(os.path.join(args.source_dir, ref), encoding="utf-8").read()
                except OSError as e:
                    failures.append(f"{s.where()}: file: {ref}: {e}")
                    continue
                if text != s.text:
                    failures.append(f"{s.where()}: the block differs from {ref}")
            if s.lang == "python" and args.no_python:
                print(f"{s.where()}: python snippet skipped (no Python package in this build)")
            elif s.lang == "python":
                if s.mark("fragment"):
                    if program_above is None:
                        failures.append(f"{s.where()}: a fragment with no complete program "
                                        "above it")
                        continue
                    text = program_above + s.text
                else:
                    text = s.text
                program_above = text
                d = workdir(args.source_dir, args.build_dir)
                program = os.path.join(d, "snippet.py")
                with open(program, "w", encoding="utf-8") as f:
                    f.write(text)
                for how, cmd in python_runs(s, program, args):
                    status, out, secs = run(cmd, d, env)
                    ran += 1
                    print(f"{s.where()}: python under {how}: status {status}, {secs:.1f} s",
                          flush=True)
                    if status != 0:
                        failures.append(f"{s.where()}: the python snippet failed under {how} "
                                        f"(status {status}):\n{out}")
                shutil.rmtree(d)
            elif s.lang == "sh" and s.mark("run"):
                d = workdir(args.source_dir, args.build_dir)
                status, out, secs = run(["bash", "-e", "-c", s.text], d, env)
                ran += 1
                print(f"{s.where()}: sh: status {status}, {secs:.1f} s", flush=True)
                if status != 0:
                    failures.append(f"{s.where()}: the shell snippet failed (status {status}):"
                                    f"\n{out}")
                shutil.rmtree(d)
            elif s.mark("run") or s.mark("torchrun too") or s.mark("fragment"):
                failures.append(f"{s.where()}: marks {s.marks} on a ```{s.lang} block "
                                "(only python and sh blocks run)")
    return failures, ran


# --- README commands ---------------------------------------------------------

COMMAND = re.compile(r"(?:^|\s)(?:\S*/)?mc2((?: +[^\s`|;&]+)+)")


def code_segments(text):
    """(line number, text) of each line of a command block (```sh or
    unlabelled: not a program, whose comments may say "mc2 ...") and of each
    inline code span."""
    block = None
    for n, line in enumerate(text.split("\n"), 1):
        if line.startswith("```"):
            block = line[3:].strip() if block is None else None
        elif block is not None:
            if block in ("", "sh", "bash", "console"):
                yield n, line
        else:
            for span in re.findall(r"`([^`]+)`", line):
                yield n, span


def help_options(mc2, words):
    """The options `mc2 WORDS --help` lists, and which take a value; None if
    WORDS is not a command."""
    p = subprocess.run([mc2, *words, "--help"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT)
    if p.returncode != 0:
        return None
    options = {}
    for line in p.stdout.decode().split("\n"):
        m = re.match(r"^\s+((?:-[\w-]+,?\s*)+)([A-Z][A-Z:0-9_ ]*(?:\s|$))?", line)
        if not m:
            continue
        takes_value = bool(m.group(2) and m.group(2).strip())
        for name in re.findall(r"-[\w-]+", m.group(1)):
            options[name] = takes_value
    return options


def check_readme_commands(path, mc2):
    failures, checked = [], 0
    cache = {}

    def options_of(command):
        key = tuple(command)
        if key not in cache:
            cache[key] = help_options(mc2, command)
        return cache[key]

    for n, segment in code_segments(open(path, encoding="utf-8").read()):
        for m in COMMAND.finditer(segment):
            words = m.group(1).split()
            if words[0].startswith("-"):  # `mc2 --version`
                checked += 1
                if words[0] not in options_of([]):
                    failures.append(f"{path}:{n}: `mc2 {words[0]}` is not an option of mc2")
                continue
            if not re.fullmatch(r"[a-z]+", words[0]):
                continue  # `mc2 COMMAND --help`: a placeholder
            command = [words[0]]
            if len(words) > 1 and re.fullmatch(r"[a-z]+", words[1]) and \
                    options_of(command + [words[1]]) is not None:
                command.append(words[1])
            options = options_of(command)
            if options is None:
                failures.append(f"{path}:{n}: `mc2 {' '.join(command)}` is not a command")
                continue
            rest, i = words[len(command):], 0
            while i < len(rest):
                w = rest[i]
                if w == "--" or (command == ["run"] and not w.startswith("-")):
                    break  # PROGRAM: what follows is the program's
                if not w.startswith("-"):
                    i += 1
                    continue
                name = w.split("=", 1)[0]
                checked += 1
                if name not in options:
                    failures.append(f"{path}:{n}: `{name}` is not an option of "
                                    f"`mc2 {' '.join(command)}` (see its --help)")
                    i += 1
                    continue
                i += 2 if options[name] and "=" not in w else 1
    return failures, checked


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source-dir", required=True)
    ap.add_argument("--build-dir", required=True)
    ap.add_argument("--mc2")
    ap.add_argument("--python", default="/usr/bin/python3")
    ap.add_argument("--no-python", action="store_true",
                    help="skip the Python snippets (a build without the Python package)")
    ap.add_argument("--readme-commands", action="store_true")
    ap.add_argument("files", nargs="+")
    args = ap.parse_args()
    args.source_dir = os.path.abspath(args.source_dir)
    args.build_dir = os.path.abspath(args.build_dir)
    args.mc2 = os.path.abspath(args.mc2 or os.path.join(args.build_dir, "tools", "mc2"))
    start = time.monotonic()
    if args.readme_commands:
        failures, count = [], 0
        for path in args.files:
            f, c = check_readme_commands(path, args.mc2)
            failures += f
            count += c
        what = f"{count} options checked"
    else:
        failures, count = check_snippets(args.files, args)
        what = f"{count} snippet runs"
    for f in failures:
        print(f"FAIL {f}", file=sys.stderr)
    print(f"{what}, {len(failures)} failures, {time.monotonic() - start:.1f} s")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
