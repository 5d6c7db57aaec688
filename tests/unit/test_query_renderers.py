"""``query``'s two renderers take the answer, the host and the screen as arguments: the
text one lays out one screen (the machine judged for, the rows, then what was left out),
the JSON one writes every field, a lockfile URL without its password."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from envbuilder.consumer.host import Gpu, Host
from envbuilder.consumer.interpreter import Interpreter
from envbuilder.consumer.query import Query, answer
from envbuilder.consumer.query_json import json_answer
from envbuilder.consumer.query_text import Layout, ThisMachine, text_answer
from envbuilder.lockfile.model import CompatLock

NOW = datetime(2026, 12, 1, tzinfo=UTC)
TWO_GPUS = Host(
    python="3.11",
    arch="x86_64",
    gpus=(
        Gpu(name="NVIDIA H100", compute_capability="9.0"),
        Gpu(name="A100", compute_capability="8.0"),
    ),
    driver="550.54.15",
    source="NVML",
)
NO_GPU = Host(python="3.11", arch="x86_64", note="no NVML")


def test_the_machine_judged_for_heads_the_answer(compat: CompatLock) -> None:
    query = Query(python="3.11", gpu="9.0", gpu_name="H100", arch="x86_64", driver="550.54.15")
    here = ThisMachine(
        host=TWO_GPUS, interpreter_line="interpreter: Python 3.11", overridden=("--gpu H100",)
    )
    lines = text_answer(
        compat, answer(compat, query), query, NOW, layout=Layout(), here=here, host_decides=True
    )
    assert lines[:4] == [
        "interpreter: Python 3.11",
        f"this machine: {TWO_GPUS.describe()}",
        "overridden: --gpu H100",
        "judged for the first GPU, NVIDIA H100",
    ]
    assert lines[4].startswith("verdicts (the worst of the four uses):")


def test_without_a_gpu_the_answer_says_where_each_build_was_verified(compat: CompatLock) -> None:
    query = Query(python="3.11", arch="x86_64", no_gpu=True)
    here = ThisMachine(host=NO_GPU, interpreter_line="interpreter: Python 3.11")
    lines = text_answer(
        compat, answer(compat, query), query, NOW, layout=Layout(), here=here, host_decides=True
    )
    assert "overridden:" not in "\n".join(lines)
    assert any(line.startswith("no NVIDIA GPU here: none of the") for line in lines)
    assert "  (--gpu NAME answers for one of them)" in lines


def test_one_combination_is_its_verdict_per_use_cut_to_the_screen(compat: CompatLock) -> None:
    combination = compat.combinations[0].id
    query = Query()
    result = answer(compat, query)
    only = replace(result, matches=tuple(m for m in result.matches if m.entry.id == combination))
    lines = text_answer(
        compat, only, query, NOW, layout=Layout(width=80, height=10), combination=combination
    )
    assert lines[0].startswith(f"{combination}: ")
    assert len(lines) <= 10 and all(len(line) <= 80 for line in lines)
    assert lines[-1].startswith("… ") and "--all shows them" in lines[-1]


def test_the_json_names_the_lockfile_without_its_password_and_who_was_judged(
    compat: CompatLock, tmp_path: Path
) -> None:
    query = Query(python="3.11")
    chosen = Interpreter(executable=tmp_path / "python", version="3.11", source="--python")
    document = json_answer(
        compat,
        answer(compat, query),
        query,
        NOW,
        path=tmp_path / "compat.lock.json",
        url="https://user:secret@example.org/compat.lock.json",
        interpreter=chosen,
        host=NO_GPU,
    )
    assert list(document) == ["lockfile", "interpreter", "host", "query", "matches", "rejected"]
    lockfile = document["lockfile"]
    assert isinstance(lockfile, dict)
    assert lockfile["url"] == "https://user:***@example.org/compat.lock.json"
    assert lockfile["carried"] is False
    assert document["interpreter"] == {
        "executable": str(tmp_path / "python"),
        "version": "3.11",
        "chosen_by": "--python",
    }
    assert document["host"] == {
        "python": "3.11",
        "arch": "x86_64",
        "gpus": (),
        "driver": None,
        "source": "",
        "note": "no NVML",
        "os": "",
    }


def test_a_row_measured_on_the_gpu_says_which_uses_are_verified_there() -> None:
    """The carried lockfile's xformers rows are measured on an H200 with the worst use
    unusable: the line says where they were measured and which uses hold there, not that
    they were never verified on any GPU."""
    from envbuilder.consumer.query_text import render
    from envbuilder.lockfile.read import load_lockfile

    carried = load_lockfile(Path(__file__).parents[2] / "envbuilder" / "data" / "compat.lock.json")
    query = Query(gpu="9.0", gpu_name="H200")
    lines = render(answer(carried, query), use=None, now=NOW, width=400, everything=True)
    (row,) = [line for line in lines if "py3.12-cu130-torch2.11.0-xformers0.0.35 " in line]
    assert row.endswith(
        "[measured on NVIDIA H200: inference, training verified; "
        "inference-compiled with a workaround]"
    ), row
