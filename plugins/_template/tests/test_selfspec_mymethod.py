"""Every plugin's suite starts here: the kit's standard suite, then your mechanics tests.

``PluginSuite`` checks that the plugin is installed and declares valid options, proves it
lossless over every tiny architecture (audited step by step, long prompts and outputs
included) and fails when the property never exercised what matters (accepted drafts, deep
drafts, every architecture). ``pytest --selfspec-coverage`` prints what it covered.
"""

from hypothesis import strategies as st

from selfspec.testing import PluginSuite


class TestMyMethod(PluginSuite):
    plugin = "mymethod"
    option_strategies = {"num_draft": st.integers(0, 6)}  # drafts of up to 6 tokens are enough here
    reach_options = {"num_draft": 6}  # the deepest drafts, in the suite's fixed long examples


# Add your own tests of the mechanics below: proposals on a hand-made history, a policy's
# reaction to a verdict, a cache after a rejected branch.
