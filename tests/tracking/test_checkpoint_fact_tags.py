"""The tags that describe an uploaded checkpoint count as the messages do (epochs from 1; the best file's step is the
step its metric value was logged at, the last file's its checkpoint's), and tags written by earlier versions (the
checkpoint's own numbers: epochs from 0, its global step) are read as they were meant."""

from __future__ import annotations

import json

from recipes.tracking.checkpoint_facts import CheckpointFacts, facts_from_tags, facts_tags
from tests.conftest import REPO

OLD_JOURNAL = REPO / "tests" / "data" / "written_before_the_simpler_core" / "classification" / "tracking-journal.jsonl"


def test_new_tags_count_as_the_messages_and_read_back_as_the_checkpoint_s_numbers():
    best = CheckpointFacts(epoch=1, step=14, monitor="val/acc", mode="max", score=0.575, time_ms=5)
    last = CheckpointFacts(epoch=1, step=14, time_ms=6)
    tags = {**facts_tags(best, "best"), **facts_tags(last, "last")}
    assert (tags["loopwise.best.epoch"], tags["loopwise.best.step"]) == ("2", "13")  # val/acc was logged at 13
    assert (tags["loopwise.last.epoch"], tags["loopwise.last.step"]) == ("2", "14")  # the checkpoint's step
    assert facts_from_tags(tags, "best") == best and facts_from_tags(tags, "last") == last


def test_tags_written_by_an_earlier_version_are_read_as_they_were_meant():
    tags: dict[str, str] = {}
    for line in OLD_JOURNAL.read_text().splitlines():  # written by 7bd1537: epochs from 0, checkpoint steps
        entry = json.loads(line)
        if entry.get("kind") == "tags":
            tags.update(entry["values"])
    assert (tags["loopwise.best.epoch"], tags["loopwise.best.step"]) == ("1", "14")
    best, last = facts_from_tags(tags, "best"), facts_from_tags(tags, "last")
    assert (best.epoch, best.step, best.monitor, best.score) == (1, 14, "val/acc", 0.574999988079071)
    assert (last.epoch, last.step) == (1, 14)
    assert facts_tags(best, "best")["loopwise.best.epoch"] == "2"  # the same file, tagged by this version
