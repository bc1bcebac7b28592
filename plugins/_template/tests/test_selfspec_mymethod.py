"""Every plugin's suite starts here: it is installed, and the kit proves it lossless."""

from hypothesis import given
from hypothesis import strategies as st

from selfspec import available_plugins as available
from selfspec.testing import ARCHS, assert_lossless, tiny_model
from selfspec.testing import strategies as sst


def test_plugin_is_installed():
    assert "mymethod" in available()


@given(arch=st.sampled_from(ARCHS), num_draft=st.integers(0, 6), data=st.data())
def test_lossless(arch, num_draft, data):
    model = tiny_model(arch)
    prompt = data.draw(sst.prompts(model.config.vocab_size))
    assert_lossless(model, "mymethod", prompt, data.draw(sst.lengths()), {"num_draft": num_draft})
