#!/usr/bin/python3
"""docs/cli.md against the `mc2` command itself: every command and
subcommand that `mc2 --help` reaches has a section in docs/cli.md, and its
table lists exactly the options and positional arguments its --help shows,
each under the same names (short and long), taking an argument exactly when
the command's takes one, with the default the command shows. Both ways: an
option missing from the page fails, and so does a row naming an option the
command does not have. The check then runs on deliberately broken copies
of the page, each of which it must reject, so that it cannot pass by
checking nothing.

Usage: cli_doc_test.py MC2_BINARY DOCS_CLI_MD
"""

import re
import subprocess
import sys

# Every command takes -h/--help; the page says so once instead of per table.
UNIVERSAL = {"-h", "--help"}
# CLI11 (2.x) prints an option's names and type in the first 30 columns.
NAME_COLUMN = 30


def run_help(mc2, path):
    proc = subprocess.run([mc2, *path, "--help"], capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(['mc2', *path, '--help'])} exited {proc.returncode}: "
                         f"{proc.stderr}")
    return proc.stdout


def sections(text):
    """{section title: [lines]} of a CLI11 help text."""
    out, current = {}, None
    for line in text.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            current = line[:-1].lower()
            out[current] = []
        elif current is not None and line.strip():
            out[current].append(line)
    return out


def parse_entries(lines):
    """[(names, type, default)] of an Options or Positionals section."""
    entries = []
    for i, line in enumerate(lines):
        if line.startswith(" " * NAME_COLUMN):
            continue  # a description on its own line
        alone = i + 1 < len(lines) and lines[i + 1].startswith(" " * NAME_COLUMN)
        left = (line if alone else line[:NAME_COLUMN]).strip()
        head, _, rest = left.partition(" ")
        rest = rest.replace("REQUIRED", "").strip()
        typ, _, default = rest.partition("=")
        entries.append((head.split(","), typ.strip(), default.strip() or None))
    return entries


def command_options(mc2, path):
    """{key: (names, takes_value, default)} for options (key: the long name,
    else the short one) and positionals (key: the name), and the
    subcommands' names."""
    sec = sections(run_help(mc2, path))
    opts = {}
    for names, typ, default in parse_entries(sec.get("options", [])):
        if set(names) <= UNIVERSAL:
            continue
        key = next((n for n in names if n.startswith("--")), names[0])
        opts[key] = (sorted(names), bool(typ), default)
    for names, typ, default in parse_entries(sec.get("positionals", [])):
        opts[names[0]] = (names, True, default)
    subs = [line.split()[0] for line in sec.get("subcommands", [])
            if not line.startswith(" " * NAME_COLUMN)]
    return opts, subs


def all_commands(mc2):
    """{"mc2 bench ops": options} for every command `mc2 --help` reaches."""
    found, todo = {}, [[]]
    while todo:
        path = todo.pop(0)
        opts, subs = command_options(mc2, path)
        found[" ".join(["mc2", *path])] = opts
        todo += [path + [s] for s in subs]
    return found


def doc_tables(text):
    """{"mc2 bench ops": {key: (names, takes_value, default_text)}} of the
    page: each `## \\`mc2 ...\\`` heading's table of | names | argument |
    default | meaning | rows."""
    tables, current, errors = {}, None, []
    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith("#"):
            current = None  # a heading that names no command ends a section
        m = re.match(r"^#{2,3} `(mc2[^`]*)`\s*$", line)
        if m:
            current = m.group(1).strip()
            if current in tables:
                errors.append(f"docs/cli.md:{n}: a second section for `{current}`")
            tables[current] = {}
            continue
        if current is None or not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 4 or set(cells[0]) <= set("-: ") or cells[0].lower() in ("name", "option"):
            continue
        names = re.findall(r"`([^`]+)`", cells[0])
        if not names:
            errors.append(f"docs/cli.md:{n}: no `name` in the first column: {line}")
            continue
        arg = cells[1].strip("` ")
        takes_value = arg not in ("", "-", "—")
        default = re.findall(r"`([^`]*)`", cells[2])
        key = next((x for x in names if x.startswith("--")), names[0])
        if key in tables[current]:
            errors.append(f"docs/cli.md:{n}: `{key}` is listed twice under `{current}`")
        tables[current][key] = (sorted(names), takes_value, default[0] if default else None,
                                cells[2])
    return tables, errors


def compare(commands, tables):
    """The differences, as messages; empty when the page is right."""
    errors = []
    for cmd in sorted(set(commands) - set(tables)):
        errors.append(f"`{cmd}` has no section (## `{cmd}`) in docs/cli.md")
    for cmd in sorted(set(tables) - set(commands)):
        errors.append(f"docs/cli.md has a section for `{cmd}`, which `mc2 --help` does not reach")
    for cmd in sorted(set(commands) & set(tables)):
        have, doc = commands[cmd], tables[cmd]
        for key in sorted(set(have) - set(doc)):
            errors.append(f"`{cmd}`: {'/'.join(have[key][0])} is in --help but not in docs/cli.md")
        for key in sorted(set(doc) - set(have)):
            errors.append(f"`{cmd}`: docs/cli.md lists {'/'.join(doc[key][0])}, which --help "
                          f"does not show")
        for key in sorted(set(have) & set(doc)):
            names, takes, default = have[key]
            dnames, dtakes, ddefault, dtext = doc[key]
            if names != dnames:
                errors.append(f"`{cmd}` {key}: --help names it {', '.join(names)}, docs/cli.md "
                              f"{', '.join(dnames)}")
            if takes != dtakes:
                errors.append(f"`{cmd}` {key}: " + ("takes an argument but docs/cli.md shows a "
                                                    "flag" if takes else "is a flag but docs/cli.md "
                                                    "shows an argument"))
            if default is not None and ddefault != default:
                errors.append(f"`{cmd}` {key}: --help shows the default {default}, docs/cli.md "
                              f"{dtext or 'none'}")
    return errors


def broken_copies(text):
    """Copies of the page with one deliberate mistake each, and what it is."""
    start = re.search(r"^## `mc2", text, re.M).start()  # the command tables only
    rows = [line for line in text[start:].splitlines() if re.match(r"^\| `-", line)]
    assert len(rows) >= 3, "docs/cli.md has too few option rows to break"
    flag = next(r for r in rows if re.match(r"^\| [^|]+\| *(—|-)? *\|", r))
    valued = next(r for r in rows if re.match(r"^\| [^|]+\| *`[^`]+` *\|", r))
    defaulted = next(r for r in rows if re.match(r"^\| [^|]+\|[^|]+\| *`[^`]+` *\|", r))
    first = rows[0]
    yield "a row left out", text.replace(first + "\n", "", 1)
    yield "an option that does not exist", text.replace(
        first + "\n", first + "\n| `--no-such-option` | `N` | | made up |\n", 1)
    yield "a long name misspelt", text.replace(first, re.sub(r"`--([a-z])", r"`--x\1", first, 1), 1)
    yield "a flag shown with an argument", text.replace(
        flag, re.sub(r"^(\| [^|]+\|)[^|]*\|", r"\1 `N` |", flag), 1)
    yield "an argument shown as a flag", text.replace(
        valued, re.sub(r"^(\| [^|]+\|)[^|]*\|", r"\1 — |", valued), 1)
    yield "a wrong default", text.replace(
        defaulted, re.sub(r"^(\| [^|]+\|[^|]+\|)[^|]*\|", r"\1 `12345` |", defaulted), 1)
    heading = re.search(r"^## `mc2 [^`]+`$", text, re.M).group(0)
    yield "a section left out", text.replace(heading, "## Not a command", 1)


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    mc2, page = sys.argv[1], sys.argv[2]
    with open(page, encoding="utf-8") as f:
        text = f.read()
    commands = all_commands(mc2)
    tables, errors = doc_tables(text)
    errors += compare(commands, tables)
    for e in errors:
        print(f"cli_doc_test: {e}", file=sys.stderr)
    if errors:
        print(f"cli_doc_test: docs/cli.md disagrees with `mc2 ... --help` ({len(errors)} "
              f"difference(s))", file=sys.stderr)
        return 1
    for what, copy in broken_copies(text):
        t, e = doc_tables(copy)
        if not e + compare(commands, t):
            print(f"cli_doc_test: a page with {what} passed the check", file=sys.stderr)
            return 1
    options = sum(len(o) for o in commands.values())
    print(f"cli_doc_test: docs/cli.md matches {len(commands)} commands, {options} options "
          f"and arguments; 7 broken copies rejected")
    return 0


if __name__ == "__main__":
    sys.exit(main())
