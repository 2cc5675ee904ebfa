"""Where golinear's data comes from, the one place of the rule every reader (the standard suites, RULER, training's
books corpus) follows: the folder given (--data-dir, a task's `data_dir` metadata), else $GOLINEAR_DATA, else
`../shared/data` beside the repository when it exists. The folder's layout and sources: docs/data.md."""
from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "GOLINEAR_DATA"
REPO_ROOT = Path(__file__).resolve().parents[1]
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


def fetch_command(data_dir: str | os.PathLike, rel_path: str) -> str:
    """The command that fetches the data folder's top folder holding `rel_path` (a partly fetched folder lacks
    it), e.g. `golinear data fetch --out DIR --folders piqa`."""
    return f"`golinear data fetch --out {data_dir} --folders {str(rel_path).strip('/').split('/')[0]}`"


def missing_data(data_dir: str | os.PathLike, rel_path: str, needs: str) -> FileNotFoundError:
    """The one-line error for a file or folder absent from an existing data folder: what it is, what needs it,
    and the command that fetches it."""
    return FileNotFoundError(f"{needs} needs {rel_path} in the data folder {str(data_dir)!r}, which does not have it; "
                             f"fetch it with {fetch_command(data_dir, rel_path)}")


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
