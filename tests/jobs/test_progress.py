"""The progress line: rewritten in place on a terminal, a throttled heartbeat elsewhere; rate and ETA from counts."""

from __future__ import annotations

import io

import pytest

from flyteplugins_batcher.jobs._progress import ProgressLine, ProgressState, format_duration


class Terminal(io.StringIO):
    """What a terminal receives (stdout that is a TTY)."""

    def isatty(self) -> bool:
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_line_shows_done_total_failed_rate_and_eta():
    state = ProgressState(done=120, failed=2, total=1000, total_known=True, rate=4.0)
    assert state.text("requests") == "progress: 120/1000 requests (12%), 2 failed | 4.00 requests/s | ETA 3m 40s"
    assert state.eta_s() == pytest.approx(220.0)


def test_while_the_input_is_read_the_line_shows_what_is_known():
    state = ProgressState(done=32, failed=0, total=340, total_known=False, rate=2.5)
    assert state.text("requests") == (
        "progress: 32 requests done of 340 read so far, 0 failed | 2.50 requests/s | ETA: not known yet"
    )
    assert state.eta_s() is None


def test_the_line_shows_output_tokens_per_second_once_measured():
    state = ProgressState(done=16, failed=0, total=32, total_known=True, rate=0.5, tokens_per_s=31.25)
    assert state.text("questions") == (
        "progress: 16/32 questions (50%), 0 failed | 0.50 questions/s, 31.2 output tokens/s | ETA 32s"
    )


def test_the_rate_counts_from_the_first_finished_chunk_so_model_loading_does_not_drag_it_down():
    clock = Clock()
    line = ProgressLine("requests", stream=io.StringIO(), interval_s=0, clock=clock)
    clock.now += 60  # the model loads
    assert line.state(8, 0, 64, tokens=400).rate == 0.0  # one chunk: no rate yet
    clock.now += 4
    later = line.state(24, 0, 64, tokens=1200)
    assert later.rate == pytest.approx(4.0)  # 16 more requests in 4 s
    assert later.tokens_per_s == pytest.approx(200.0)  # 800 more tokens in 4 s


def test_rates_measured_by_the_caller_win():
    line = ProgressLine("requests", stream=io.StringIO(), interval_s=0, clock=Clock())
    state = line.state(16, 0, 64, tokens=900, rates=(0.5, 28.0))
    assert (state.rate, state.tokens_per_s) == (0.5, 28.0)
    assert state.eta_s() == pytest.approx(96.0)  # 48 left at 0.5/s, from the first finished request on


def test_on_a_terminal_one_line_is_rewritten_in_place_and_ends_with_the_final_counts():
    terminal, clock = Terminal(), Clock()
    line = ProgressLine("questions", stream=terminal, clock=clock)
    for done in (8, 16, 24, 32):
        clock.now += 1
        line.show(line.state(done, 1, 32))
    line.close(line.state(32, 1, 32))

    output = terminal.getvalue()
    assert output.count("\n") == 1 and output.endswith("\n")  # one line on screen
    assert output.count("\r") == 5  # four updates and the final state, each over the last
    final = output.rstrip("\n").rsplit("\r", 1)[-1]
    assert final == "progress: 32/32 questions (100%), 1 failed | 8.00 questions/s | done\x1b[K"


def test_elsewhere_lines_are_throttled_to_the_interval():
    log, clock = io.StringIO(), Clock()
    line = ProgressLine("requests", stream=log, interval_s=60, clock=clock)
    for _ in range(10):  # a chunk every 20 s
        clock.now += 20
        line.show(line.state(8, 0, 100))
    line.close(line.state(100, 0, 100))

    lines = log.getvalue().splitlines()
    assert len(lines) == 4  # at 20 s, 80 s, 140 s and 200 s; nothing at the close: the summary follows
    assert all(text.startswith("progress: ") and "\r" not in text for text in lines)


@pytest.mark.parametrize(("seconds", "text"), [(42.4, "42s"), (258, "4m 18s"), (7500, "2h 05m")])
def test_durations_read_naturally(seconds: float, text: str):
    assert format_duration(seconds) == text
