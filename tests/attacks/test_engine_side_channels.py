"""Issue 7, classes 2 and 4: one query must not read one row's bit through the optimizer or through Python.

Against the build before issue 7 every oracle here won the balanced game (benchmarks/attacks/side_channels.py:
512/512 bits for class 2, 122/128 for class 4, at 32 rounds each); the assertion is the DP bound on success.
"""

from __future__ import annotations

import pytest

from benchmarks.attacks.side_channels import CLASSES, ChannelClass, attack, write_class_worlds
from benchmarks.attacks.stats import success_bound

PEOPLE, ROUNDS, SEED = 40, 16, 17


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    folder = tmp_path_factory.mktemp("side_channels")
    return {channel.name: {o.name: o for o in attack(write_class_worlds(folder, channel, PEOPLE, SEED), channel,
                                                     ROUNDS, SEED)}
            for channel in CLASSES}


CASES = [(channel, name) for channel in CLASSES for name in channel.oracles]


@pytest.mark.parametrize(("channel", "name"), CASES, ids=[f"{c.name.split(',')[0]}: {n}" for c, n in CASES])
def test_one_query_reveals_no_more_than_its_epsilon(outcomes, channel: ChannelClass, name: str) -> None:
    outcome = outcomes[channel.name][name]
    bound = success_bound(channel.epsilon, channel.budget.query_delta)
    assert outcome.game.lower() <= bound, f"{name}: success {outcome.game}"
    assert outcome.crashes == 0, f"{name}: {outcome.crashes} failures after the charge were not the generic error"
