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

Options: a composition declares its own (``budget``, ``cheap_first``) and each member's as
``MEMBER.name``. Only the composition's own and the member options named in
``option_strategies`` are drawn; every other member option keeps its default (members' options
often constrain each other: the member's own suite explores them).
"""

from __future__ import annotations

from typing import Any, ClassVar

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
            ``cheap_first``); other member options keep their defaults.

    Returns:
        Nothing; its tests pass or fail with a ``LosslessError`` naming the hook, the step and
        (for a member's own hook) the member.

    Host enforces:
        The same losslessness and coverage rules as :class:`~selfspec.testing.PluginSuite`.
    """

    plugin_object: ClassVar[Any] = None

    def test_plugin_is_installed(self) -> None:
        from selfspec._engine.compose import member_names
        from selfspec._engine.plugins import available

        members = member_names(self.plugin) or []
        assert len(members) >= 2, f"{type(self).__name__}: {self.plugin!r} names no composition (a+b)"
        objects = self.plugin_object or {}
        for m in members:
            assert m in objects or m in available(), f"member {m!r} is not installed"
        pm, _ = self._manager()
        assert pm.has_plugin(self.plugin)

    def options_strategy(self, model: Any, declared: dict[str, Any]) -> Any:
        from selfspec.testing import strategies as sst

        drawn = {k: v for k, v in declared.items() if "." not in k or k in self.option_strategies}
        return sst.options(drawn, fixed=self.fixed_options, strategies=self.option_strategies)
