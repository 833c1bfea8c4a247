"""What tfdistx writes for another program, built from data by an emitter:
a shell word (`shlex.quote`), a command line as one comment line, a YAML
stream (PyYAML's safe dumper). A user's text is never pasted into a line
of a script or a manifest: a value holding a newline, a quote, `---`, `$()`
or a backtick stays that value, and can end no line nor start one
(`tfdistx job slurm|tfjob|jobset|trainjob`).

Why bash's `$'...'` beside shlex: a comment ends at the first line break,
and shlex.quote keeps a newline as it is (inside quotes, which a comment
does not have). `$'...'` writes every character a line cannot hold as an
escape, and pasted into a shell it gives back the very argument. No
library writes it (shlex has no such quoting).
"""

import shlex
from typing import Iterable, List, Sequence

import yaml  # PyYAML, which omegaconf depends on

# What ends a line for YAML (1.1, which PyYAML and Kubernetes' go-yaml read) and for bash: a comment holds none.
LINE_BREAKS = ("\n", "\r", "\x85", "\u2028", "\u2029")
_ESCAPES = {"\\": "\\\\", "'": "\\'", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def shell_word(text: str) -> str:
    """`text` as one shell word: shlex.quote's, or bash's `$'...'` when it
    holds a character that is not printable (a line break, a control
    character, a byte that is not UTF-8), each written as an escape."""
    if text.isprintable():
        return shlex.quote(text)
    return "$'" + "".join(_escaped(char) for char in text) + "'"


def _escaped(char: str) -> str:
    if char in _ESCAPES:
        return _ESCAPES[char]
    if char.isprintable():
        return char
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # a byte of the command line that was not UTF-8 (Python's surrogateescape)
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code < 0x80 else f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def command_line(words: Iterable[str]) -> str:
    """A command line, each word quoted (shell_word): one line, which a shell reads back as these words."""
    return " ".join(shell_word(word) for word in words)


def comment(text: str) -> str:
    """`# text`, refused (a bug) when text would end the line: only what tfdistx wrote, or command_line's."""
    if any(brk in text for brk in LINE_BREAKS):
        raise ValueError(f"a comment line cannot hold a line break: {text!r}")
    return f"# {text}"


def yaml_stream(documents: Sequence[dict], header: Sequence[str] = ()) -> str:
    """The documents as one YAML stream (PyYAML's safe dumper: every value quoted as it needs), after `header`'s
    comment lines."""
    lines: List[str] = [comment(line) + "\n" for line in header]
    return "".join(lines) + yaml.safe_dump_all(list(documents), sort_keys=False)
