"""models.model_path: the checkpoint a config serves."""

import json

from patchbay.runtime import synth
from patchbay.runtime.models import model_path, tiny_path

from ..conftest import LOCAL


def test_the_default_and_the_test_model_keep_their_own_folders(tiny_model):
    served = model_path(LOCAL)
    assert served == str(tiny_path(LOCAL.synth_seed, LOCAL.synth_context)) != tiny_model
    marker = json.loads((tiny_path(0, synth.TINY_CONTEXT) / synth.MARKER).read_text())
    assert marker["context"] == synth.TINY_CONTEXT  # serving the default left the test model alone
    config = json.loads((tiny_path(LOCAL.synth_seed, LOCAL.synth_context) / "config.json").read_text())
    assert config["max_position_embeddings"] == LOCAL.synth_context == 65536
