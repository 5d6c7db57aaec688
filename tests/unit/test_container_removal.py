"""A build's container is removed however the removal goes: interrupted inside the
request, refused by a loaded daemon for a while, or already being removed by someone else."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
from docker.errors import APIError, NotFound

import envbuilder.docker.containers as containers


@dataclass
class Container:
    """A container whose `remove` answers from ``answers`` (an exception to raise, or None
    for a removal that went through); once removed, every later call is NotFound."""

    answers: list[BaseException | None]
    short_id: str = "c0ffee"
    removed: bool = False
    calls: int = field(default=0)

    def remove(self, force: bool = False) -> None:
        assert force
        self.calls += 1
        if self.removed:
            raise NotFound("No such container: c0ffee")
        answer = self.answers.pop(0) if self.answers else None
        if answer is not None:
            raise answer
        self.removed = True


def api_error(status: int, text: str) -> APIError:
    return APIError(
        text,
        response=SimpleNamespace(
            status_code=status, url="http+docker://localhost/v1.41/containers/c0ffee", reason=""
        ),
        explanation=text,
    )


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(containers, "_REMOVE_RETRY_S", 0.01)
    monkeypatch.setattr(containers, "_REMOVE_PATIENCE_S", 2.0)


def test_an_interruption_inside_the_request_still_removes_the_container() -> None:
    """SIGTERM lands while the removal's request is on its way (the daemon never saw it):
    the container is removed all the same, and the interruption goes on."""
    container = Container(answers=[KeyboardInterrupt()])
    with pytest.raises(KeyboardInterrupt):
        containers._discard(container)  # type: ignore[arg-type]
    assert container.removed


def test_a_removal_the_daemon_refuses_for_a_while_is_tried_again() -> None:
    refused = api_error(500, "Could not kill running container c0ffee, cannot remove - "
                        "tried to kill container, but did not receive an exit event")  # fmt: skip
    container = Container(answers=[refused, refused])
    assert containers._discard(container) is None  # type: ignore[arg-type]
    assert container.removed and container.calls == 3


def test_a_removal_refused_past_the_patience_is_reported_not_raised(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(containers, "_REMOVE_PATIENCE_S", 0.05)
    refused = api_error(500, "driver failed removing container: device or resource busy")
    container = Container(answers=[refused] * 1000)
    problem = containers._discard(container)  # type: ignore[arg-type]
    assert problem is not None and problem.startswith("could not remove the container c0ffee")
    assert "device or resource busy" in problem
    assert not container.removed and container.calls >= 2


def test_a_removal_in_progress_elsewhere_is_waited_for_and_called_gone() -> None:
    in_progress = api_error(409, "removal of container c0ffee is already in progress")
    done_elsewhere = NotFound("No such container: c0ffee")
    container = Container(answers=[in_progress, in_progress, done_elsewhere])
    assert containers._discard(container) == containers._GONE  # type: ignore[arg-type]
    assert container.calls == 3


def test_a_container_someone_else_removed_is_gone() -> None:
    container = Container(answers=[NotFound("No such container: c0ffee")])
    assert containers._discard(container) == containers._GONE  # type: ignore[arg-type]
