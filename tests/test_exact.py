"""Exact mode: a forward over any number of positions gives, row for row, bitwise the logits
of one-token forwards (chains and trees, every kit architecture, float32 and bfloat16), and a
decode in exact mode equals ``vanilla`` in exact mode bit for bit."""

from __future__ import annotations

import pytest
import torch

from selfspec._engine.runner import Runner
from selfspec.testing._archs import ARCHS
from selfspec.testing._models import tiny_model

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@pytest.fixture(params=["as-checked-here", "rows-in-groups", "each-row-alone"])
def placement(request, monkeypatch):
    """Products as the checks found them here, or as on machines whose kernels round a row by
    how many rows a product has (rows in groups of ROWS) or by its place among them (every row
    alone, first in its product)."""
    from selfspec._engine.runner import exact, exact_attention

    if request.param == "rows-in-groups":
        monkeypatch.setattr(
            exact_attention, "attention_rows_invariant", lambda *a: len(a) < 4 or a[3] == exact.ROWS
        )
        monkeypatch.setattr(
            exact, "row_invariant", lambda product, width, like: width == exact.ROWS
        )
    if request.param == "each-row-alone":
        monkeypatch.setattr(exact_attention, "attention_rows_invariant", lambda *a: False)
        monkeypatch.setattr(exact, "row_invariant", lambda *a: False)
    return request.param


def _runner(arch: str, dtype: torch.dtype, layout: str = "auto") -> Runner:
    torch.manual_seed(0)
    return Runner(tiny_model(arch).to(dtype), weight_layout=layout, exact=True)


def _steps(r: Runner, ids: torch.Tensor, start: int, path: list[int]) -> torch.Tensor:
    """Logits of one-token forwards over ``ids[:start]`` then the tokens ``path``."""
    cache = r.new_cache(start + len(path) + 1)
    r.forward(ids[:start], cache=cache, start=0, logits=None)
    rows = [
        r.forward(torch.tensor([t]), cache=cache, start=start + i).logits[-1]
        for i, t in enumerate(path)
    ]
    return torch.stack(rows)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize(
    ("start", "k"), [(7, 20), (60, 8), (128, 3)], ids=["short", "across-a-key-block", "long"]
)
def test_a_block_equals_its_one_token_forwards_bitwise(arch, dtype, start, k, placement):
    r = _runner(arch, DTYPES[dtype])
    ids = torch.randint(
        0, r.vocab_size, (start + k,), generator=torch.Generator().manual_seed(start)
    )
    one = _steps(r, ids, start, ids[start:].tolist())
    cache = r.new_cache(start + k)
    r.forward(ids[:start], cache=cache, start=0, logits=None)
    block = r.forward(ids[start:], cache=cache, start=start).logits
    assert torch.equal(one, block)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_every_tree_node_equals_the_one_token_forwards_along_its_path(arch, dtype, placement):
    from selfspec._engine.runner import masks

    r = _runner(arch, DTYPES[dtype])
    g = torch.Generator().manual_seed(1)
    start = 70
    ids = torch.randint(0, r.vocab_size, (start + 1,), generator=g)
    parents = torch.tensor([-1, -1, 0, 0, 1, 2, 2, 4, 5, 8, -1, 3])  # siblings at every depth
    nodes = torch.randint(0, r.vocab_size, (len(parents),), generator=g)
    cache = r.new_cache(start + 1 + len(parents))
    r.forward(ids[:start], cache=cache, start=0, logits=None)
    block = torch.cat([ids[start : start + 1], nodes])
    out = r.forward(
        block,
        cache=cache,
        start=start,
        block_mask=masks.tree(parents),
        positions=masks.tree_positions(parents, start),
    ).logits
    for i in range(len(parents)):
        path, j = [], i
        while j >= 0:
            path.append(int(nodes[j]))
            j = int(parents[j])
        path = [int(ids[start])] + path[::-1]
        assert torch.equal(out[i + 1], _steps(r, ids, start, path)[-1]), f"node {i}"


@pytest.mark.parametrize("arch", ARCHS)
def test_exact_forwards_compute_the_same_logits_as_the_default_mode_up_to_rounding(arch, placement):
    # bitwise agreement between exact forwards says nothing of their values: this does
    from selfspec._engine.runner import masks

    torch.manual_seed(0)
    model = tiny_model(arch).to(torch.float64)
    exact, plain = (
        Runner(model, weight_layout="model", exact=True),
        Runner(model, weight_layout="model"),
    )
    g = torch.Generator().manual_seed(3)
    start, parents = 70, torch.tensor([-1, -1, 0, 0, 1, 2, 2, 4, 5, 8, -1, 3])
    ids = torch.randint(0, exact.vocab_size, (start + 1 + len(parents),), generator=g)
    for chain in (True, False):  # keys in slot order, and a tree's nodes gathered in position order
        kw = (
            {}
            if chain
            else {
                "block_mask": masks.tree(parents),
                "positions": masks.tree_positions(parents, start),
            }
        )
        outs = []
        for r in (exact, plain):
            cache = r.new_cache(len(ids))
            r.forward(ids[:start], cache=cache, start=0, logits=None)
            outs.append(r.forward(ids[start:], cache=cache, start=start, **kw).logits)
        torch.testing.assert_close(outs[0], outs[1], rtol=1e-9, atol=1e-9)


def test_rows_with_equal_keys_share_products_in_order_and_alone_rows_are_first_in_their_own():
    from selfspec._engine.runner.exact import ROWS
    from selfspec._engine.runner.exact_attention import _place

    keys = torch.tensor([5, 2, 5, 5, 2] + [7] * (ROWS + 1))
    group, row, owner = _place(keys, alone=False)
    places = list(zip(group.tolist(), row.tolist()))
    assert len(set(places)) == len(keys)  # no two rows in one place
    for g in set(group.tolist()):
        # a product holds one key's rows
        assert {int(k) for k in keys[group == g]} == {int(owner[g])}
        # from row 0 on
        assert sorted(row[group == g].tolist()) == list(range(int((group == g).sum())))
    assert owner.tolist() == [2, 5, 7, 7]  # the 9 rows of key 7 take two products
    group, row, owner = _place(keys, alone=True)
    assert group.tolist() == list(range(len(keys))) and row.tolist() == [0] * len(keys)
    assert owner.tolist() == keys.tolist()


class _Rounding(torch.nn.Module):
    """A product whose rows are independent but whose rounding may depend on how many rows it
    computes at once (above ``widest``), or on a row's place among them (``by_place``), as a
    kernel switching its blocking with the width would."""

    in_features, out_features = 6, 5

    def __init__(self, widest: int = 10**6, by_place: bool = False) -> None:
        super().__init__()
        self.widest, self.by_place, self.widths = widest, by_place, []

    def forward(self, x):
        self.widths.append(x.shape[0])
        y = x[:, :5] * 3.0
        if self.by_place:
            y = torch.cat([y[:1], y[1:] * (1 + 2**-20)])
        return y * (1 + 2**-20) if x.shape[0] > self.widest else y


@pytest.mark.parametrize("kind", ["invariant", "rounds-by-width", "rounds-by-place"])
def test_a_product_runs_as_wide_as_was_checked_row_invariant_and_equals_one_token_forwards(kind):
    from selfspec._engine.runner import exact

    exact._checked.clear()
    inner = (
        _Rounding(widest=16)
        if kind == "rounds-by-width"
        else _Rounding(by_place=kind == "rounds-by-place")
    )
    rows = exact.RowInvariantLinear(inner)
    x = torch.randn(30, 6)
    with torch.no_grad():
        alone = torch.cat([rows(x[i : i + 1]) for i in range(30)])  # one-token forwards
        inner.widths.clear()
        block = rows(x)
    exact._checked.clear()
    assert torch.equal(block, alone)
    width, R = -(-30 // exact.ROWS) * exact.ROWS, exact.ROWS
    # invariant: the 30 rows unpadded; else padded to a multiple of ROWS, in groups or alone
    used = {
        "invariant": [30],
        "rounds-by-width": [R] * (width // R),
        "rounds-by-place": [R] * width,
    }[kind]
    assert inner.widths[-len(used) :] == used


def test_the_model_layout_is_row_invariant_too():
    r = _runner("llama", torch.float32, layout="model")
    ids = torch.randint(0, r.vocab_size, (40,), generator=torch.Generator().manual_seed(0))
    one = _steps(r, ids, 30, ids[30:].tolist())
    cache = r.new_cache(40)
    r.forward(ids[:30], cache=cache, start=0, logits=None)
    assert torch.equal(one, r.forward(ids[30:], cache=cache, start=30).logits)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_a_drafting_plugin_in_exact_mode_equals_vanilla_in_exact_mode_in_bf16(arch):
    from selfspec import Decoder

    model = tiny_model(arch).to(torch.bfloat16)
    prompt = [3, 4, 5, 6, 3, 4, 5, 6, 3, 4, 5, 7] * 3
    ref = Decoder(model, "vanilla", exact=True).generate(prompt, 48, eos_token_ids=())
    got = Decoder(model, "lookup", exact=True).generate(prompt, 48, eos_token_ids=())
    assert got.stats.drafted > 0  # drafts were verified in blocks
    assert got.output_ids == ref.output_ids


def test_check_exact_compares_with_vanilla_exact(tmp_path):
    import json

    from _tiny_models import save_tiny_llama
    from click.testing import CliRunner

    from selfspec.app._cli import cli

    model_dir = save_tiny_llama(tmp_path / "m")
    out = CliRunner().invoke(
        cli,
        [
            "--model",
            str(model_dir),
            "--dtype",
            "bf16",
            "--exact",
            "--plugin",
            "lookup",
            "check",
            "--json",
            "-n",
            "12",
            "--prompt",
            "the cat sat on the mat the cat",
        ],
    )
    assert out.exit_code == 0, out.output
    blob = json.loads(out.output[out.output.index("{") :])
    assert blob["exact"] is True and [r["status"] for r in blob["results"]] == ["OK"]


class _NearTieVerifier:
    """A verifier that accepts a draft token within a few bf16 ulps of the top-1 (a lossy rule
    the default mode's near-tie bound cannot tell from rounding), drafting the model's
    runner-up wherever the top two are that close."""

    ULPS = 4

    def __init__(self) -> None:
        self.flips = 0

    from selfspec import hookimpl

    @hookimpl
    def selfspec_propose(self, state):
        from selfspec import Draft

        base = state.length - 1
        out = state.runner.forward(
            state.tokens[base : base + 1], cache=state.cache, start=base, write=False
        )
        top2 = torch.topk(out.logits[-1].float(), 2)
        tol = self.ULPS * torch.finfo(torch.bfloat16).eps * float(top2.values[0].abs())
        if float(top2.values[0] - top2.values[1]) <= tol:
            return Draft.chain([int(top2.indices[1])], device=state.runner.device)
        return Draft.empty(state.runner.device)

    @hookimpl
    def selfspec_verify(self, state, draft):
        from selfspec import Verdict, verify_greedy

        v = verify_greedy(state, draft)
        if len(draft) and not v.accepted:
            base = state.length - 1
            out = state.runner.forward(state.tokens[base : base + 1], cache=state.cache, start=base)
            logits = out.logits[-1].float()
            top = float(logits.max())
            t = int(draft.tokens[0])
            # wrong
            if float(logits[t]) >= top - self.ULPS * torch.finfo(torch.bfloat16).eps * abs(top):
                self.flips += 1
                nxt = state.runner.forward(
                    draft.tokens[:1], cache=state.cache, start=base + 1
                ).logits[-1]
                return Verdict((t,), int(nxt.argmax()), (0,))
        return v


def test_a_verifier_accepting_near_ties_is_caught_in_bf16_only_in_exact_mode():
    from selfspec.testing import LosslessError, assert_lossless

    model = tiny_model("llama").to(torch.bfloat16)
    prompts = [list(range(3 + i, 40 + i, 3)) for i in range(6)]
    caught = 0
    for prompt in prompts:
        plugin = _NearTieVerifier()
        try:
            assert_lossless(model, "neartie", prompt, 32, plugin_object=plugin, exact=True)
        except LosslessError as exc:
            assert "exact mode" in str(exc)
            caught += 1
        else:
            assert plugin.flips == 0  # a decode it passed never took a near-tie
    assert caught > 0, "the near-tie verifier never took a near-tie: the example shows nothing"


def test_the_layers_of_one_forward_share_one_attention_plan_per_mask(monkeypatch):
    from selfspec._engine.runner import exact_attention

    made = []
    real = exact_attention._make_plan
    monkeypatch.setattr(
        exact_attention, "_make_plan", lambda *a: made.append(a[0].shape) or real(*a)
    )
    r = _runner("llama", torch.float32)
    assert r.n_layers > 1
    cache = r.new_cache(20)
    r.forward(torch.arange(12), cache=cache, start=0, logits=None)
    r.forward(torch.arange(3), cache=cache, start=12)
    assert made == [(1, 1, 12, 12), (1, 1, 3, 15)]


def test_an_attention_plan_follows_its_mask_changed_in_place():
    from selfspec._engine.runner.exact_attention import _plans, exact_attention, position_mask

    g = torch.Generator().manual_seed(0)
    q, n = 3, 10
    query, key, value = (
        torch.randn(1, 4, q, 8, generator=g),
        torch.randn(1, 2, n, 8, generator=g),
        torch.randn(1, 2, n, 8, generator=g),
    )
    causal = torch.ones(q, n, dtype=torch.bool).tril(n - q)
    mask = position_mask(causal, torch.arange(n), q)
    exact_attention(None, query, key, value, mask, 0.3)
    mask[..., 0] = -1  # no query sees slot 0 any more
    got = exact_attention(None, query, key, value, mask, 0.3)[0]
    _plans.clear()
    assert torch.equal(got, exact_attention(None, query, key, value, mask.clone(), 0.3)[0])
    assert not torch.equal(
        got,
        exact_attention(None, query, key, value, position_mask(causal, torch.arange(n), q), 0.3)[0],
    )
