"""The sampling spec a mini-batch mode builds from its options: what it accepts, and a
clear error for what it does not."""
from __future__ import annotations

import numpy as np
import pytest

from sarc.sampling import SamplingSpec
from sarc.training.inputs import TrainError
from sarc.training.minibatch import MiniBatchConfig


def test_numpy_integer_fanouts_are_fanouts():
    assert SamplingSpec.of([np.int64(10), np.int32(-1)]).fanouts == (10, -1)


def test_a_string_of_fanouts_is_refused_as_a_string():
    """It was split into characters first: '10,25' said "layer 1 ... got '1'"."""
    with pytest.raises(TrainError, match=r"fanouts must be a list of integers, one per layer, "
                                         r"got '10,25'"):
        MiniBatchConfig("sampling", "10,25").spec(2, 0)


@pytest.mark.parametrize("mode, fanouts", [("mfg", None), ("sampling", (5,))])
def test_a_model_without_sarc_layers_is_refused_as_such(mode, fanouts):
    """mfg said "fanouts is empty: give one fanout per graph layer", of a mode without
    fanouts."""
    with pytest.raises(TrainError, match=rf"--mode {mode}: the model has no sarc layer to run "
                                         rf"on the sampled blocks"):
        MiniBatchConfig(mode, fanouts).spec(0, 0)
