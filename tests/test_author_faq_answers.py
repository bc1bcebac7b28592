"""What a third plugin author (Lookahead decoding: a Jacobi window riding in the verification
pass as an ``ExtraBlock``) asked of the contract, each answer checked.

The regions between ``# [start:NAME]`` and ``# [end:NAME]`` are shown in docs/faq.md
("Questions authors ask") verbatim (``scripts/docsync.py``). Models: the kit's tiny random
Llama in float64 (1024 positions), so every comparison is exact.
"""

from __future__ import annotations

import json

import pytest
import torch

from selfspec import (
    Decoder,
    Draft,
    ExtraBlock,
    PluginError,
    Sampling,
    hookimpl,
    reference_generate,
    verify_tree,
)
from selfspec._engine.contract.plugins import instantiate, load_file
from selfspec._engine.tuning.machine import ThreadChoice, plural

PROMPT = [5, 17, 3, 99, 42, 7, 7, 1]


@pytest.fixture
def model(tiny_model_factory):
    return tiny_model_factory("llama")


def next_token(model, ids):
    """The model's own greedy token after ``ids`` (a plain forward of the whole sequence)."""
    return int(model(torch.tensor([ids])).logits[0, -1].to(torch.float32).argmax())


class Window:
    """Verifies every draft with ``verify_tree`` and an extra block: ``n`` tokens after the
    pending one (the pending token repeated, standing in for a Jacobi window)."""

    def __init__(self, n: int = 3) -> None:
        self.n, self.seen = n, []

    @hookimpl
    def selfspec_verify(self, state, draft):
        # [start:extra-block]
        base = state.length - 1  # the pending token's slot and absolute position
        e = self.n
        ids = torch.full((e,), state.pending, dtype=torch.long)
        # absolute: the extra tokens follow the pending one
        positions = torch.arange(base + 1, base + 1 + e)
        mask = torch.ones(e, e, dtype=torch.bool).tril()  # causal among themselves
        extra = ExtraBlock(ids, positions, mask, rows=torch.arange(e))
        verdict, preds = verify_tree(state, draft, extra)  # preds[j]: the pick after extra token j
        # [end:extra-block]
        self.seen.append((state.committed.tolist(), ids.tolist(), preds))
        return verdict


def test_extra_block_positions_are_absolute(model):
    plugin = Window()
    out = Decoder(model, "window", plugin_object=plugin).generate(
        PROMPT, max_new_tokens=6, eos_token_ids=()
    )
    # the draft's verdict is untouched
    assert out.output_ids == reference_generate(model, PROMPT, 6)
    # each extra row predicts as a plain forward of the sequence
    for committed, ids, preds in plugin.seen:
        assert preds == [next_token(model, committed + ids[: j + 1]) for j in range(len(ids))]


def test_extra_rows_get_the_decodes_pick_under_sampling(model):
    seen = []

    class Sampled(Window):
        @hookimpl
        def selfspec_verify(self, state, draft):
            verdict = super().selfspec_verify(state, draft)
            committed, ids, preds = self.seen[-1]
            logits = torch.stack(
                [
                    model(torch.tensor([committed + ids[: j + 1]])).logits[0, -1]
                    for j in range(len(ids))
                ]
            )
            # the positions picked for
            at = torch.arange(len(committed) + 1, len(committed) + 1 + len(ids))
            seen.append((preds, state.pick(logits, at).tolist()))
            return verdict

    # [start:extra-sampled]
    sampling = Sampling(temperature=0.8, top_k=0, top_p=0.95, seed=3)
    Decoder(model, "window", plugin_object=Sampled).generate(
        PROMPT, 6, eos_token_ids=(), sampling=sampling
    )
    # [end:extra-sampled]
    assert seen and all(preds == picks for preds, picks in seen)


def test_cache_room_for_a_verify_block_and_what_happens_past_it(model):
    class Room(Window):
        @hookimpl
        def selfspec_verify(self, state, draft):
            # [start:cache-room]
            # prompt + max_new_tokens + draft_slack (256 by default)
            capacity = state.cache.capacity
            # slots for [pending, nodes..., extra...] from the pending slot
            room = capacity - (state.length - 1)
            # [end:cache-room]
            # one more token than fits: [pending, nodes..., extra...] is room + 1
            self.n = room - len(draft)
            return super().selfspec_verify(state, draft)

    dec = Decoder(model, "room", plugin_object=Room)
    assert dec.draft_slack == 256
    with pytest.raises(
        PluginError,
        match=r"selfspec_verify raised ValueError: block of \d+ tokens at slot \d+ "
        r"exceeds the cache capacity",
    ):
        dec.generate(PROMPT, max_new_tokens=4, eos_token_ids=())


def test_positions_past_the_model_limit_are_a_clear_error(model):
    # [start:position-limit]
    dec = Decoder(model)
    limit = dec.runner.max_positions  # max_position_embeddings: 1024 on the tiny models
    # the last token at position limit - 1
    dec.generate([1] * (limit - 8), max_new_tokens=8, eos_token_ids=())
    with pytest.raises(ValueError, match="need 1025 positions; the model holds 1024"):
        dec.generate([1] * (limit - 8), max_new_tokens=9)
    with pytest.raises(ValueError, match="position 1024 is past the model's limit"):
        dec.runner.forward(torch.tensor([1, 2]), positions=torch.tensor([1023, 1024]))
    # [end:position-limit]

    class PastTheEnd(Window):  # an extra block past the limit, from a hook: the plugin is named
        @hookimpl
        def selfspec_verify(self, state, draft):
            self.n = limit + 1 - state.length  # the last extra token at position 1024
            return super().selfspec_verify(state, draft)

    with pytest.raises(
        PluginError, match="plugin 'past': selfspec_verify raised ValueError: position 1024"
    ):
        Decoder(model, "past", plugin_object=PastTheEnd).generate(
            [1] * (limit - 8), 8, eos_token_ids=()
        )


def test_reference_generate_returns_the_new_tokens_only(model):
    # [start:reference]
    new = reference_generate(model, PROMPT, 6)  # generate(do_sample=False), plain greedy
    assert len(new) == 6  # the new tokens only, never the prompt
    stop = reference_generate(model, PROMPT, 6, eos_token_ids=[new[2]])
    assert stop == new[: new.index(new[2]) + 1]  # up to and including the first EOS
    # [end:reference]


def test_empty_drafts_carry_an_owner_and_are_verified(model):
    class Mine:
        verified = 0

        # [start:empty-draft]
        @hookimpl
        def selfspec_propose(self, state):
            return Draft.empty(state.runner.device, owner=self, why="nothing to draft")

        @hookimpl
        def selfspec_verify(self, state, draft):
            self.verified += 1  # called for an empty draft too (once per step)
            assert draft.is_from(self) and draft.meta["why"] == "nothing to draft"
            return None  # defer: the host's verifier commits the bonus token alone
            # [end:empty-draft]

    dec = Decoder(model, "mine", plugin_object=Mine)
    out = dec.generate(PROMPT, max_new_tokens=5, eos_token_ids=())
    assert dec.plugin.verified == out.stats.steps == 5


def test_plugin_file_picks_the_class_the_file_defines(tmp_path):
    path = tmp_path / "lookahead.py"
    # [start:plugin-file-choice]
    path.write_text(
        "from selfspec.testing._mutants import Echo  # another plugin's class, imported\n"
        "class Lookahead(Echo):  # defined here: its hooks are inherited\n"
        "    pass\n"
    )
    name, module = load_file(path)
    assert name == "lookahead" and type(instantiate(module)).__name__ == "Lookahead"
    # [end:plugin-file-choice]
    two = tmp_path / "two.py"
    two.write_text(
        "from selfspec.testing._mutants import Echo\n"
        "class A(Echo):\n    pass\nclass B(Echo):\n    pass\n"
    )
    with pytest.raises(
        ValueError, match="several plugin classes .*A, B.*name the one to use `Plugin`"
    ):
        instantiate(load_file(two)[1])


def test_plugin_counters_go_to_stats_extra_and_to_json_and_the_bench(model):
    from selfspec.app._bench.harness import Method, make_record, make_runner
    from selfspec.app._bench.results import summarize
    from selfspec.app._data import Sample

    class Counting:
        # [start:stats-extra]
        @hookimpl
        def selfspec_update_policy(self, state, verdict):
            extra = state.stats.extra  # the plugin's own counters: numbers, names of its choice
            extra["bonus_only"] = extra.get("bonus_only", 0) + (not verdict.accepted)
            # [end:stats-extra]

    out = Decoder(model, "counting", plugin_object=Counting).generate(PROMPT, 5, eos_token_ids=())
    assert out.stats.extra == {"bonus_only": 5}
    # specdec --json's stats
    assert json.loads(json.dumps(out.stats.as_dict()))["extra"] == {"bonus_only": 5}
    method = Method.of_plugin("counting", plugin_object=Counting)
    run = make_runner(method, model)(PROMPT, 5, set())
    sample = Sample(task="t", id="q1", prompt="x", key="k")
    rec = make_record(sample, method, run, PROMPT, None, None, 0, 0)
    assert rec["extra"] == {"bonus_only": 5}  # results.jsonl
    rows = summarize([rec, dict(rec, question_id="q2")], baseline="counting")
    assert rows[0]["extra"] == {"bonus_only": 10}  # summary.json: summed per task and method


def test_coverage_is_skipped_naming_the_architectures_whose_lossless_test_did_not_pass():
    from selfspec.testing import PluginSuite

    class Suite(PluginSuite):
        plugin = "vanilla"
        archs = ("llama", "gemma3")

    cov = Suite.coverage()
    cov.done.add("llama")  # test_lossless[gemma3] failed (or did not run)
    with pytest.raises(
        pytest.skip.Exception,
        match=r"passed in this session; not passed \(failed or not run\): "
        r"\['gemma3'\]",
    ):
        Suite().test_lossless_coverage()


def test_one_thread_is_one_thread():
    assert (
        plural(1, "thread") == "1 thread"
        and plural(2, "thread") == "2 threads"
        and plural("?", "core") == "? cores"
    )
    note = ThreadChoice(1, "busy", 6.8, 2, "PASSIVE").note()
    assert "running on 1 thread with OMP_WAIT_POLICY=PASSIVE" in note
