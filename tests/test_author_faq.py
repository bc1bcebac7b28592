"""What a new plugin author asked while writing a plugin from the docs alone.

Every answer in docs/faq.md ("Questions authors ask") that is code is checked here; the
regions between ``# [start:NAME]`` and ``# [end:NAME]`` are shown in that page verbatim
(``scripts/docsync.py``), so the page cannot drift from what the host does.

Set-up: a) a tiny random Llama in float64 from the kit's factory (no downloads), so exact
comparisons are exact; b) plugins are small classes defined here and handed to the
:class:`~selfspec.Decoder` with ``plugin_object=``, the way a plugin's own tests do.
"""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch

import selfspec
from selfspec import Decoder, Draft, Option, OptionError, Runner
from selfspec.testing import assert_lossless

PROMPT = [5, 17, 3, 99, 42, 7, 7, 1]


@pytest.fixture
def model(tiny_model_factory):
    return tiny_model_factory("llama")  # see a)


# --------------------------------------------------------------------------- Runner.forward
def test_forward_returns_hidden_and_logits(model):
    # [start:forward]
    runner = Runner(model)
    ids = torch.tensor([5, 17, 3, 99, 42])  # [q] token ids; batch size is always 1
    out = runner.forward(ids)  # no cache: the block attends only to itself
    assert out.hidden.shape == (1, 5, runner.hidden_size)  # [1, q, H], before the final norm
    assert out.logits.shape == (5, runner.vocab_size)  # logits="all" (default): one row per token
    assert torch.equal(runner.head(out.hidden[0]), out.logits)  # head = final norm + LM head

    assert runner.forward(ids, logits="last").logits.shape == (1, runner.vocab_size)
    assert runner.forward(ids, logits=torch.tensor([0, 3])).logits.shape == (2, runner.vocab_size)
    assert runner.forward(ids, logits=None).logits is None  # skip the LM head (prefill)
    # stop after layer 0: no logits, whatever logits= says
    half = runner.forward(ids, layers=(0, 1))
    assert half.logits is None
    early = runner.head(half.hidden[0])  # an early exit: [q, V] from a mid-model state
    # [end:forward]
    assert early.shape == (5, runner.vocab_size)


def test_start_names_the_cache_slots_a_block_writes(model):
    # [start:start]
    runner = Runner(model)
    ids = torch.tensor(PROMPT)  # [8]
    cache = runner.new_cache(capacity=32)
    runner.forward(ids[:6], cache=cache, start=0, logits=None)  # slots 0-5, like the loop's prefill
    assert cache.length == 6
    step = runner.forward(ids[6:], cache=cache, start=6)  # slots 6-7, attending to slots 0-5
    assert cache.length == 8
    whole = runner.forward(ids)  # the same 8 tokens in one block, no cache
    torch.testing.assert_close(step.logits, whole.logits[6:], rtol=0, atol=1e-12)
    cache.crop(6)  # drop slots 6-7 from the valid length (how a rejected draft is rolled back)
    assert cache.length == 6
    again = runner.forward(ids[6:], cache=cache, start=6)  # the next write overwrites slots 6-7
    assert torch.equal(again.logits, step.logits)
    # [end:start]


# --------------------------------------------------------------------------- options
class Depth:
    """Drafts the pending token ``k`` times (usually wrong, always safe); ``k=None``: the
    plugin decides (here: a quarter of the model's layers)."""

    # [start:option-none]
    @selfspec.hookimpl
    def selfspec_options(self, register):
        register(Option("k", int, None, "draft length (default: the plugin decides)", min=0))
        register(Option("threshold", float, 0.5, "a float option", min=0.0, max=1.0))

    @selfspec.hookimpl
    def selfspec_setup(self, runner, options):
        self.k = options["k"] if options["k"] is not None else max(1, runner.n_layers // 4)
        # [end:option-none]

    @selfspec.hookimpl
    def selfspec_propose(self, state):
        k = min(self.k, state.max_draft_depth)
        return Draft.chain([state.pending] * k, device=state.runner.device)


def test_float_options_take_ints_and_strings():
    opt = Option("threshold", float, 0.5, "a float option", min=0.0, max=1.0)
    assert (
        opt.convert("0.25") == 0.25 and opt.convert(1) == 1.0 and isinstance(opt.convert(1), float)
    )
    with pytest.raises(OptionError, match="above the maximum"):
        opt.convert("1.5")


def test_none_means_the_plugin_decides(model):
    # [start:none]
    given = Decoder(model, "depth", {"k": None}, plugin_object=Depth)  # explicit None
    omitted = Decoder(model, "depth", plugin_object=Depth)  # not given
    assert given.options["k"] is omitted.options["k"] is None
    assert given.plugin.k == omitted.plugin.k == max(1, given.runner.n_layers // 4)  # it decided
    assert_lossless(model, "depth", PROMPT, 12, options={"k": None}, plugin_object=Depth)
    with pytest.raises(OptionError, match="only an option whose default is None accepts"):
        Decoder(model, "depth", {"threshold": None}, plugin_object=Depth)  # it has a real default
    # [end:none]


# --------------------------------------------------------------------------- inference mode
class Recorder:
    """Records ``torch.is_inference_mode_enabled()`` in every hook it implements."""

    def __init__(self) -> None:
        self.seen: dict[str, bool] = {}

    def _mark(self, hook: str) -> None:
        self.seen[hook] = torch.is_inference_mode_enabled()

    @selfspec.hookimpl
    def selfspec_setup(self, runner):
        self._mark("setup")

    @selfspec.hookimpl
    def selfspec_start(self, state):
        self._mark("start")

    @selfspec.hookimpl
    def selfspec_propose(self, state):
        self._mark("propose")

    @selfspec.hookimpl
    def selfspec_verify(self, state, draft):
        self._mark("verify")

    @selfspec.hookimpl
    def selfspec_cache(self, state, verdict):
        self._mark("cache")

    @selfspec.hookimpl
    def selfspec_update_policy(self, state, verdict):
        self._mark("update_policy")

    @selfspec.hookimpl
    def selfspec_end(self, state, result):
        self._mark("end")


def test_hooks_of_a_decode_run_under_inference_mode(model):
    rec = Recorder()
    Decoder(model, "recorder", plugin_object=rec).generate(PROMPT, 4)
    # setup runs when the Decoder is built, outside generate: no inference mode there
    assert rec.seen == {
        "setup": False,
        "start": True,
        "propose": True,
        "verify": True,
        "cache": True,
        "update_policy": True,
        "end": True,
    }


# --------------------------------------------------------------------------- naming and objects
def test_plugin_file_is_named_after_its_module(tmp_path: Path):
    path = tmp_path / "my_guess.py"
    path.write_text(
        "from selfspec import Draft\n\n"
        "def selfspec_propose(state):\n    return Draft.empty(state.runner.device)\n"
    )
    # [start:plugin-file]
    assert selfspec.app.Settings(plugin_file=str(path)).plugin_name == "my_guess"  # the file's stem
    # --plugin wins
    assert selfspec.app.Settings(plugin="mine", plugin_file=str(path)).plugin_name == "mine"
    # [end:plugin-file]


def test_plugin_object_takes_a_class_an_instance_or_a_module(model):
    # [start:plugin-object]
    # a class: one new instance per Decoder
    a = Decoder(model, "depth", {"k": 2}, plugin_object=Depth)
    b = Decoder(model, "depth", {"k": 3}, plugin_object=Depth)
    assert (
        isinstance(a.plugin, Depth)
        and a.plugin is not b.plugin
        and (a.plugin.k, b.plugin.k) == (2, 3)
    )
    mine = Depth()
    c = Decoder(model, "depth", {"k": 2}, plugin_object=mine)  # an instance: used as it is (shared)
    assert c.plugin is mine
    # [end:plugin-object]
    module = types.ModuleType("plain")
    module.selfspec_propose = lambda state: Draft.empty(state.runner.device)
    assert Decoder(model, "plain", plugin_object=module).plugin is module  # module-level hooks
