"""log_tail.py FILE N: the last N lines of a log as valid UTF-8, 400 characters each.

A log of a killed process can end inside a character and a progress bar's updates are one `\\r`-joined line, so
`tail | cut -c` (which cuts bytes) once printed half a bar glyph and broke the decoding of a script's output."""
import sys
from pathlib import Path


def log_tail(path: Path, n: int, width: int = 400) -> str:
    if not path.is_file():
        return f"({path}: no log)"
    lines = path.read_bytes().decode("utf-8", "replace").replace("\r", "\n").splitlines()
    return "\n".join(line[:width] for line in (lines[-n:] if n > 0 else []))


if __name__ == "__main__":
    print(log_tail(Path(sys.argv[1]), int(sys.argv[2])))
