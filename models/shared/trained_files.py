"""Reading a trained part's files (adapters, configs, weight lists): whatever a file holds that is
not what training saved (cut short, random bytes, an empty file, a header that lies about its
tensors, JSON of another shape) becomes one ModelError naming the file and how to get a good one
back: reinstall evsel for a file it ships, train again for one of the user's."""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

from evsel.errors import EvselError, ModelError

SHIPPED = Path(__file__).resolve().parent.parent / "adapters"


def remedy(path: Path, train_command: str) -> str:
    """How to get a good copy of `path` back."""
    if Path(path).resolve().is_relative_to(SHIPPED):
        return "reinstall evsel (pip install --force-reinstall evsel), which ships that file"
    return f"train it again with: {train_command} --out DIR (or point the setting at a good folder)"


def damaged(path: Path, what: str, train_command: str, why: str) -> ModelError:
    return ModelError(f"{what} {path} is damaged ({why})", remedy(path, train_command))


def _why(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:160]}" if text else type(exc).__name__


@contextmanager
def reading(path: Path, what: str, train_command: str):
    """Around code that reads `path` and builds from it: any failure its content causes is one
    ModelError about that file. EvselErrors (a part of another backbone shape) pass as they are."""
    from safetensors import SafetensorError

    try:
        yield
    except EvselError:
        raise
    except FileNotFoundError as exc:
        raise ModelError(f"{what} {path} is missing", remedy(path, train_command)) from exc
    except (OSError, ValueError, TypeError, KeyError, IndexError, AttributeError, RuntimeError,
            SafetensorError) as exc:
        raise damaged(path, what, train_command, _why(exc)) from exc


def read_json(path: Path, what: str, train_command: str) -> dict:
    """The JSON object in `path` (a file of another shape, even valid JSON, is damaged)."""
    with reading(path, what, train_command):
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise damaged(path, what, train_command, f"it holds a JSON {type(data).__name__}, not an object")
    return data


def read_tensors(path: Path, what: str, train_command: str) -> dict:
    """The tensors of a safetensors file, on the CPU."""
    from safetensors.torch import load_file

    with reading(path, what, train_command):
        return load_file(str(path))
