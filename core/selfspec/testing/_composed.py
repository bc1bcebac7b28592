"""``ComposedSuite``: the standard suite of a composition of plugins (``"lookup+selfsd"``).

    from selfspec.testing import ComposedSuite

    class TestLookupSelfSD(ComposedSuite):
        plugin = "lookup+selfsd"
        option_strategies = {"selfsd.num_draft": st.integers(1, 8)}

Everything :class:`~selfspec.testing.PluginSuite` generates (installed, valid options, the
audited losslessness property on every architecture, coverage, decodes on one instance), for
the composed decode: one merged draft verified in one pass, each member given the verdict of
its own draft. The audit checks every member's hooks as they return, so a lossy member fails
with an error naming the member, not the composition.

Options: a composition declares its own (``budget``, ``cheap_first``, ``counterfactual``) and
each member's as ``MEMBER.name``. Only the composition's own and the member options named in
``option_strategies`` are drawn; every other member option keeps its default (members' options
often constrain each other: the member's own suite explores them).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from selfspec._engine.contract.markers import hookimpl
from selfspec._engine.contract.types import DecodeState, Draft
from selfspec.testing._suite import PluginSuite


class ComposedSuite(PluginSuite):
    """A composition's standard suite: subclass with ``plugin = "a+b"``.

    Called:
        Collected by pytest like :class:`~selfspec.testing.PluginSuite`.

    Args:
        plugin: the composed name, members joined by ``+``.
        plugin_object: ``{member: class, module or instance}`` for members that are not
            installed (a plugin under development, the authoring template).
        option_strategies: strategies for ``MEMBER.option`` names (and ``budget``,
            ``cheap_first``, ``counterfactual``); other member options keep their defaults.

    Returns:
        Nothing; its tests pass or fail with a ``LosslessError`` naming the hook, the step and
        (for a member's own hook) the member.

    Host enforces:
        The same losslessness and coverage rules as :class:`~selfspec.testing.PluginSuite`.
    """

    plugin_object: ClassVar[Any] = None
    #: The 520-token reach example with a one-node merged draft (at most two tokens a step): at
    #: least 260 steps whatever the machine's timings make of the cheap-first rule.
    long_options: ClassVar[dict[str, Any]] = {"budget": "1"}

    def test_plugin_is_installed(self) -> None:
        from selfspec._engine.contract.plugins import available, member_names

        members = member_names(self.plugin) or []
        assert len(members) >= 2, (
            f"{type(self).__name__}: {self.plugin!r} names no composition (a+b)"
        )
        objects = self.plugin_object or {}
        for m in members:
            assert m in objects or m in available(), f"member {m!r} is not installed"
        pm, _ = self._manager()
        assert pm.has_plugin(self.plugin)

    def options_strategy(self, model: Any, declared: dict[str, Any]) -> Any:
        from selfspec.testing import strategies as sst

        drawn = {k: v for k, v in declared.items() if "." not in k or k in self.option_strategies}
        return sst.options(
            drawn, fixed=self.fixed_options, strategies=self.option_strategies, model=model
        )


# ---------------------------------------------------------------- a member of a composition
class LossyMember:
    """A composable drafter (no verify or cache hook) whose proposer is lossy: used as one member
    of a composition (``"lookup+lossy"``), the kit must catch it and blame the member."""

    bug = "a composition member's proposer writes its draft's KV over the last committed slot"
    trigger = "composed with another plugin, 40+ committed tokens, with a draft"
    hook = "selfspec_propose"
    at = 40
    fault_step: ClassVar[int | None] = None

    @hookimpl
    def selfspec_setup(self) -> None:
        type(self).fault_step = None

    @hookimpl
    def selfspec_propose(self, state: DecodeState) -> Draft:
        ids = state.committed.tolist()
        draft = Draft.empty(state.runner.device)
        for j in range(len(ids) - 2, -1, -1):  # what followed the pending token's last occurrence
            if ids[j] == ids[-1]:
                draft = Draft.chain(
                    ids[j + 1 : j + 5][: state.max_draft_depth], device=state.runner.device
                )
                break
        if state.length >= self.at and len(draft) and state.length >= 2:
            if type(self).fault_step is None:
                type(self).fault_step = state.step
            block = torch.cat([state.tokens[state.length - 1 : state.length], draft.tokens])
            state.runner.forward(block, cache=state.cache, start=state.length - 2, logits=None)
        return draft


#: Mutants that are members of a composition (``tests/test_composed_suite.py`` scores them).
COMPOSED_MUTANTS: tuple[type, ...] = (LossyMember,)
