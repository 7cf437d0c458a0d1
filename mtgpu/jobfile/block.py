"""The leading comment block of a batch script, where directives are read (as sbatch
reads `#SBATCH`): from the top, blank lines and lines whose first non-blank character is
`#` (the shebang included); the first other line ends it. And the words of one
directive line (split_words: #MTGPU's rules and sbatch's differ in two points)."""

from __future__ import annotations

from mtgpu.jobfile.errors import JobFileError


def prefixed_lines(text: str, prefix: str, at_column_one: bool) -> tuple[list[tuple[int, str]], list[int]]:
    """The lines of the block that start with `prefix` then whitespace or nothing, as
    (number, the rest of the line), and the numbers of such lines after the block.
    `at_column_one`: the prefix must start the line (sbatch's rule for #SBATCH); else
    blanks may come before it."""
    inside: list[tuple[int, str]] = []
    late: list[int] = []
    in_block = True
    for number, line in enumerate(text.split("\n"), start=1):
        if number == 1 and line.startswith("\ufeff"):
            line = line[1:]
        stripped = line.strip()
        if in_block and stripped and not stripped.startswith("#"):
            in_block = False
        written = line if at_column_one else stripped
        if not written.startswith(prefix):
            continue
        rest = written[len(prefix):]
        if rest and not rest[0].isspace():
            continue  # "#MTGPUX" / "#SBATCHX" is some other comment
        if in_block:
            inside.append((number, rest))
        else:
            late.append(number)
    return inside, late


def split_words(text: str, line: int | None, *, backslash: bool, hash_inside_word: bool) -> list[str]:
    """A directive line's words: blanks separate, `"` and `'` quote, an unquoted `#` ends the
    line (at the start of a word; anywhere with `hash_inside_word`, as sbatch has it), and with
    `backslash` a backslash escapes the next character (sbatch's; #MTGPU lines keep it)."""
    tokens: list[str] = []
    current: list[str] = []
    in_token = escape = False
    quote: str | None = None
    for ch in text:
        if escape:
            current.append(ch)
            escape = False
        elif backslash and ch == "\\":
            escape = in_token = True
        elif quote is not None:
            if ch == quote:
                quote = None
            else:
                current.append(ch)
        elif ch in "\"'":
            quote, in_token = ch, True
        elif ch == "#" and (hash_inside_word or not in_token):
            break
        elif ch.isspace():
            if in_token:
                tokens.append("".join(current))
                current, in_token = [], False
        else:
            current.append(ch)
            in_token = True
    if quote is not None:
        raise JobFileError(f"a {quote} quote is not closed; close it or remove it", line=line)
    if in_token:
        tokens.append("".join(current))
    return tokens
