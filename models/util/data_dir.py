"""Where golinear's data comes from, the one place of the rule every reader (the standard suites, RULER, training's
books corpus) follows: the folder given (--data-dir, a task's `data_dir` metadata), else $GOLINEAR_DATA, else
`../shared/data` beside the repository when it exists. The folder's layout and sources: docs/data.md."""
from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "GOLINEAR_DATA"
REPO_ROOT = Path(__file__).resolve().parents[2]  # models/util/data_dir.py -> the repository
DEFAULT_DATA_DIR = REPO_ROOT.parent / "shared" / "data"
HINT = (f"give the data folder with --data-dir or ${ENV_VAR}, or build one with `golinear data fetch --out DIR` "
        "(what it holds: docs/data.md)")


def chosen_data_dir(data_dir: str | os.PathLike | None = None) -> str | None:
    """The folder named (explicitly or by $GOLINEAR_DATA), else the default one when it exists, else None."""
    explicit = data_dir if data_dir not in (None, "") else os.environ.get(ENV_VAR) or None
    if explicit is not None:
        return str(explicit)
    return str(DEFAULT_DATA_DIR) if DEFAULT_DATA_DIR.is_dir() else None


def existing_data_dir(data_dir: str | os.PathLike | None = None, needs: str = "the data") -> Path:
    """The chosen folder, which must exist (a one-line FileNotFoundError naming what needed it and the hint)."""
    chosen = chosen_data_dir(data_dir)
    if chosen is None:
        raise FileNotFoundError(f"{needs} needs a local data folder and none was found (no {DEFAULT_DATA_DIR}); {HINT}")
    path = Path(chosen).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(f"data folder {chosen!r} does not exist; {HINT}")
    return path


def top_folder(rel_path: str) -> str:
    return str(rel_path).strip("/").split("/")[0]


def fetch_command(data_dir: str | os.PathLike, *rel_paths: str) -> str:
    """The command that fetches the data folder's top folders holding `rel_paths` (a partly fetched folder lacks
    them), e.g. `golinear data fetch --out DIR --folders piqa`."""
    return f"`golinear data fetch --out {data_dir} --folders {','.join(dict.fromkeys(map(top_folder, rel_paths)))}`"


class MissingData(FileNotFoundError):
    """A file or folder absent from an existing data folder: what it is, what needs it, the command that fetches it."""

    def __init__(self, data_dir: str | os.PathLike, rel_path: str, needs: str):
        self.data_dir, self.rel_path, self.needs = str(data_dir), rel_path, needs
        super().__init__(f"{needs} needs {rel_path} in the data folder {self.data_dir!r}, which does not have it; "
                         f"fetch it with {fetch_command(data_dir, rel_path)}")


missing_data = MissingData


def all_missing(errors: list[MissingData]) -> MissingData | FileNotFoundError:
    """One line for everything a partly fetched folder lacks: each part and what needs it, one fetch command."""
    needs: dict[str, list[str]] = {}
    for e in errors:
        needs.setdefault(e.rel_path, []).append(e.needs)
    if len(needs) == 1 and len(errors) == 1:
        return errors[0]
    parts = "; ".join(f"{rel} ({', '.join(who[:3])}{f' and {len(who) - 3} more' if len(who) > 3 else ''})"
                      for rel, who in needs.items())
    return FileNotFoundError(f"the data folder {errors[0].data_dir!r} does not have {parts}; fetch "
                             f"{'it' if len(needs) == 1 else 'them'} with {fetch_command(errors[0].data_dir, *needs)}")


def hub_reachable(timeout: float = 8.0) -> bool:
    """Whether the Hugging Face Hub answers (any HTTP reply counts); False when its offline switches are set."""
    import urllib.error
    import urllib.request
    if "1" in (os.environ.get("HF_HUB_OFFLINE"), os.environ.get("HF_DATASETS_OFFLINE")):
        return False
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    try:
        urllib.request.urlopen(urllib.request.Request(f"{endpoint}/api/datasets/ybisk/piqa", method="HEAD"),
                               timeout=timeout).close()
    except urllib.error.HTTPError:
        return True
    except (urllib.error.URLError, OSError):
        return False
    return True


def require_hub(needs: str, otherwise: str = "") -> None:
    """Without a data folder the standard suites come from the Hub: a one-line answer when it cannot be reached
    (`otherwise`: what the user can run instead, appended)."""
    if not hub_reachable():
        raise FileNotFoundError(f"{needs} needs a local data folder or the Hugging Face Hub; there is no data folder "
                                f"(no {DEFAULT_DATA_DIR}) and the Hub cannot be reached: {HINT}{otherwise}")
