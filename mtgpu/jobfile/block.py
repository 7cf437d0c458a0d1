"""The leading comment block of a batch script, where directives are read (as sbatch
reads `#SBATCH`): from the top, blank lines and lines whose first non-blank character is
`#` (the shebang included); the first other line ends it."""

from __future__ import annotations


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
