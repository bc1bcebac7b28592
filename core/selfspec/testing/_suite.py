"""``PluginSuite``: a plugin's whole standard suite as a class with a few attributes.

    from selfspec.testing import PluginSuite

    class TestLookup(PluginSuite):
        plugin = "lookup"
        option_strategies = {"num_draft": st.integers(1, 12)}  # optional: constrain options

generates, for that plugin:

* ``test_plugin_is_installed``: the entry point loads (or ``plugin_object`` registers);
* ``test_declares_valid_options``: declared defaults convert, and every option the class
  fixes, constrains or uses for the reach examples is declared and valid;
* ``test_lossless[arch-device]``: the losslessness property over every architecture in
  ``archs`` and every device (``selfspec_device``): a Hypothesis test drawing a
  :class:`~selfspec.testing._scenarios.Scenario` (wide, boundary-weighted prompt and output
  lengths up to ``max_prompt``/``max_new_tokens``; repetitive prompts; EOS mid-output) and
  ``strategies.options(declared)``, plus the fixed :func:`~selfspec.testing._scenarios.reach`
  examples (a 520+-token prompt with a 260-token output on every architecture, a 520-token
  output, short edge cases) and the fixed examples where bugs hide (sampling with top-k
  alone, top-p alone and both; two EOS ids; every id an EOS id, so a wrong first draft token is
  one EOS id where the model predicts another; an output to the model's last position; in
  float64 the near-tie variant of the tiny model), each decoded in audit mode by
  :func:`~selfspec.testing.assert_lossless` and recorded in the suite's coverage;
* ``test_lossless_across_decodes[arch-device]``: one :class:`~selfspec.Decoder` (so one
  plugin instance, set up once) decodes a warm-up and then :data:`DECODE_SEQUENCE` in turn,
  each checked by ``assert_lossless``: the way ``specdec bench`` (a method's warm-up and
  every prompt) and ``specdec check`` (every prompt) run a plugin, so state a plugin keeps
  across decodes is exercised, then the same prompt sampled under :data:`SAMPLED_SEEDS`.
  The Hypothesis property builds a fresh ``Decoder`` per example instead, so a failing
  example replays and shrinks on its own;
* ``test_verify_any_draft[arch-device]``: for a plugin with its own ``selfspec_verify``,
  its verifier on kit-made chains and trees on a real decode
  (:mod:`selfspec.testing._anydraft`), each verdict compared with the host's verification;
* ``test_lossless_offloaded[arch]``: the same model split over CPU memory and disk by
  accelerate (:func:`~selfspec.testing.split_device_map`: weights loaded from the disk by
  accelerate's hooks on every forward), one :class:`~selfspec.Decoder` decoding
  :data:`OFFLOAD_SEQUENCE` and one sampled decode, each checked by ``assert_lossless``
  against ``generate`` on the same placement: a plugin works on a model bigger than memory;
* ``test_lossless_coverage``: after every ``test_lossless`` of the class passed, fails when a
  required bucket (:data:`selfspec.testing._coverage.REQUIRED`, and
  :data:`~selfspec.testing._coverage.REQUIRED_PER_ARCH` of every architecture) was never hit,
  printing what was; skipped, naming the architectures, when one of them did not pass.

A failing example's message keeps its first line (hook, step, token, margin), summarises
long token lists and names a JSON file with the whole example (:mod:`selfspec.testing._report`).

Add the plugin's own mechanics tests as more methods of the class or beside it.
"""

from __future__ import annotations

import zlib
from typing import Any, ClassVar

import pytest

from selfspec.testing._archs import ARCHS, POSITIONS
from selfspec.testing._coverage import Coverage, coverage_for
from selfspec.testing._sequences import (
    ANY_DRAFT_EOS_AT,
    ANY_DRAFT_NEW,
    ANY_DRAFT_PROMPT,
    DECODE_SEQUENCE,
    OFFLOAD_SEQUENCE,
    SAMPLED_SEEDS,
)


class PluginSuite:
    """A plugin's whole standard suite: subclass with ``plugin = "name"``.

    Called:
        Collected by pytest like any test class; each inherited test runs the plugin on the
        kit's tiny models of every architecture (``docs/testing-plugins.md`` lists them).

    Args:
        plugin: the plugin's entry-point name (or the name ``plugin_object`` registers).
        plugin_object: a class, instance or module to test instead of an installed plugin.
        option_strategies: Hypothesis strategies for some options (``{"k": st.integers(1, 8)}``),
            or callables taking the model and returning one (``strategies.draft_weights``).
        reach_options, coverage_exempt, dtypes and the other class attributes below: optional,
            each documented where it is declared.

    Returns:
        Nothing; its tests pass or fail with a ``LosslessError`` whose first line names the
        hook, the step, the token and the margin.

    Host enforces:
        Losslessness: float64 outputs equal to the reference exactly; float32 and bf16 up to
        the near-tie rule; a coverage bucket left empty fails unless exempted with a reason.
    """

    #: The plugin's entry-point name (or the name to register ``plugin_object`` under).
    plugin: ClassVar[str] = ""
    #: An unpackaged plugin (class, module or instance) to test instead of the entry point.
    plugin_object: ClassVar[Any] = None
    #: Architectures to prove lossless on (all by default; narrow only with a reason).
    archs: ClassVar[tuple[str, ...]] = ARCHS
    #: Options pinned in every example.
    fixed_options: ClassVar[dict[str, Any]] = {}
    #: ``{option: strategy or (model -> strategy)}`` replacing how some options are drawn.
    option_strategies: ClassVar[dict[str, Any]] = {}
    #: Options of the fixed reach examples: the ones that draft deepest.
    reach_options: ClassVar[dict[str, Any]] = {}
    #: Options over ``reach_options`` in the longest-output reach example only: bound a plugin's
    #: tokens per step there when its deepest drafts (or the machine's timings) would finish the
    #: 520 tokens in under 256 steps (the ``steps>=256`` bucket).
    long_options: ClassVar[dict[str, Any]] = {}
    #: Lengths that matter to this plugin (buffer size, depth limit): drawn with +-1 as prompt
    #: and output lengths; one past the drawn limits raises them, one past the tiny models'
    #: positions fails ``test_declares_valid_options`` and ``test_lossless`` with the reason.
    boundaries: ClassVar[tuple[int, ...]] = ()
    #: Longest drawn prompt and output (None: ``scenarios.MAX_PROMPT``/``MAX_NEW``, 768 and 160).
    max_prompt: ClassVar[int | None] = None
    max_new_tokens: ClassVar[int | None] = None
    #: ``{bucket: reason}`` for required coverage buckets this plugin cannot reach.
    coverage_exempt: ClassVar[dict[str, str]] = {}
    #: Config overrides of the tiny models (``tiny_model_factory(arch, **model_overrides)``).
    model_overrides: ClassVar[dict[str, Any]] = {}
    #: dtype of the tiny models: ``None`` is float64 (exact equality); ``torch.bfloat16`` or
    #: ``torch.float32`` run the same property under the near-tie bound
    #: (:func:`selfspec._engine.contract.tiebound.tie_bound`), each difference within it reported.
    model_dtype: ClassVar[Any] = None
    #: Exact mode (docs/losslessness.md): None (default) runs it whenever ``model_dtype`` is not
    #: float64, so a float32/bf16 suite compares bit for bit with ``vanilla`` in exact mode and
    #: has no near-tie rule; False keeps the near-tie rule against ``generate``.
    exact: ClassVar[bool | None] = None
    #: Drawn examples per architecture and device, besides the reach and sampled examples; None:
    #: the profile's ``max_examples`` left after the reach set, spread over the architectures, at
    #: least 2 (2 each under ``selfspec-ci``: 59 examples in all with the 9 of the reach set and
    #: the 8 fixed examples of each architecture). The trivial draw (1-token prompt, 1 new token)
    #: is never made.
    examples_per_arch: ClassVar[int | None] = None
    #: Options of ``test_lossless_offloaded`` (default: the plugin's own defaults, so the host's
    #: draft weights are built from the offloaded layers as a user's decode builds them).
    offload_options: ClassVar[dict[str, Any]] = {}
    #: Run under this Hypothesis profile instead of the loaded one (the kit's mutation test).
    hypothesis_profile: ClassVar[str | None] = None
    #: False: stop at the first failing example and report it as drawn, without shrinking it.
    shrink: ClassVar[bool] = True

    # ------------------------------------------------------------------ parametrization
    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if "suite_arch" in metafunc.fixturenames:
            metafunc.parametrize("suite_arch", list(self.archs))

    @classmethod
    def suite_name(cls) -> str:
        return f"{cls.__module__}::{cls.__qualname__}"

    @classmethod
    def coverage(cls) -> Coverage:
        """This suite's coverage counters (shared by the class's tests in this process)."""
        return coverage_for(cls.suite_name())

    def _manager(self) -> tuple[Any, dict[str, Any]]:
        from selfspec._engine.contract.manager import make_manager
        from selfspec._engine.contract.plugins import declared_options

        pm, _ = make_manager(self.plugin, self.plugin_object)
        return pm, declared_options(pm)

    # ------------------------------------------------------------------ generated tests
    def test_plugin_is_installed(self) -> None:
        from selfspec._engine.contract.plugins import available

        assert self.plugin, f"{type(self).__name__} sets no plugin name"
        if self.plugin_object is None:
            assert self.plugin in available(), f"plugin {self.plugin!r} is not installed"
        pm, _ = self._manager()
        assert pm.has_plugin(self.plugin) or self.plugin == "vanilla"

    def test_declares_valid_options(self) -> None:
        from selfspec._engine.contract.options import resolve

        _, declared = self._manager()
        for opt in declared.values():
            if opt.default is not None:
                opt.convert(opt.default)
        for attr in ("fixed_options", "option_strategies", "reach_options", "long_options"):
            unknown = sorted(set(getattr(self, attr)) - set(declared))
            assert not unknown, f"{attr} names options {self.plugin!r} does not declare: {unknown}"
        resolve(
            declared, {**self.reach_options, **self.long_options, **self.fixed_options}, self.plugin
        )
        self.limits()  # a boundary past the tiny models' positions: the reason, here too

    def limits(self) -> Any:
        """The drawn lengths' :class:`~selfspec.testing._scenarios.Limits`, raised to the
        class's ``boundaries`` (``ValueError`` past the models' positions)."""
        from selfspec.testing._scenarios import MAX_NEW, MAX_PROMPT, Limits

        positions = int(self.model_overrides.get("max_position_embeddings", POSITIONS))
        lim = Limits(self.max_prompt or MAX_PROMPT, self.max_new_tokens or MAX_NEW, positions)
        return lim.extended(self.boundaries)

    def options_strategy(self, model: Any, declared: dict[str, Any]) -> Any:
        """The options drawn for one model: ``strategies.options(declared)`` with the class's
        ``fixed_options`` and ``option_strategies``. Override when valid options depend on
        the model (its number of layers, say)."""
        from selfspec.testing import strategies as sst

        return sst.options(
            declared, fixed=self.fixed_options, strategies=self.option_strategies, model=model
        )

    def test_lossless(self, suite_arch: str, selfspec_device: str, tiny_model_factory: Any) -> None:
        from hypothesis import Phase, example, given, seed, settings

        from selfspec.testing._scenarios import (
            every_id_eos,
            last_position,
            near_tied,
            reach,
            sampled,
            sampled_filters,
            scenarios,
            several_eos,
        )

        cov = self.coverage()
        _, declared = self._manager()
        lim = self.limits()
        dtype = {} if self.model_dtype is None else {"dtype": self.model_dtype}
        model = tiny_model_factory(
            suite_arch, device=selfspec_device, **dtype, **self.model_overrides
        )
        opts = self.options_strategy(model, declared)
        base = (
            settings.get_profile(self.hypothesis_profile)
            if self.hypothesis_profile
            else settings.default
        )
        fixed = reach(self.archs, lim.positions)
        n = self.examples_per_arch
        if n is None:
            n = max(2, (base.max_examples - len(fixed)) // len(self.archs))

        twins: list[Any] = []  # the near-tie variant, built when an example asks for it

        def check(scenario: Any, options: dict[str, Any]) -> None:
            if scenario.near_ties and not twins:
                twins.append(
                    tiny_model_factory(
                        suite_arch, device=selfspec_device, near_ties=True, **self.model_overrides
                    )
                )
            self.check_example(twins[0] if scenario.near_ties else model, scenario, options, cov)

        drawn = scenarios(
            [suite_arch],
            max_prompt=lim.max_prompt,
            max_new=lim.max_new,
            boundaries=self.boundaries,
            positions=lim.positions,
        )
        test = given(scenario=drawn, options=opts)(check)
        # explicit examples run last-applied first: the reach set (where most bugs live), then
        # the sampling example, then the draws
        fixed_opts = {**self.reach_options, **self.fixed_options}
        long_opts = {**self.reach_options, **self.long_options, **self.fixed_options}
        ties = [near_tied(suite_arch)] if self.model_dtype is None else []  # exact only in float64
        test = example(scenario=every_id_eos(suite_arch), options=fixed_opts)(
            test
        )  # the last fixed one
        for sc in (
            *sampled_filters(suite_arch),
            several_eos(suite_arch),
            *ties,
            last_position(suite_arch, lim.positions),
        ):
            test = example(scenario=sc, options=fixed_opts)(test)
        test = example(scenario=sampled(suite_arch), options=fixed_opts)(test)
        longest = max(sc.max_new_tokens for sc in fixed)
        for sc in (sc for sc in fixed if sc.arch == suite_arch):
            test = example(
                scenario=sc, options=long_opts if sc.max_new_tokens == longest else fixed_opts
            )(test)
        if base.derandomize:  # a fixed sequence per plugin and architecture, not one for all
            test = seed(zlib.crc32(f"{self.plugin}:{suite_arch}".encode()))(test)
        # not shrinking: stop at the first failing example, as drawn (no further explicit ones)
        phases = (
            {}
            if self.shrink
            else {"phases": [Phase.explicit, Phase.generate], "report_multiple_bugs": False}
        )
        settings(base, max_examples=n, **phases)(test)()
        cov.done.add(suite_arch)

    def test_lossless_across_decodes(
        self, suite_arch: str, selfspec_device: str, tiny_model_factory: Any
    ) -> None:
        from selfspec._engine.contract.loop import Decoder
        from selfspec.testing._lossless import assert_lossless

        dtype = {} if self.model_dtype is None else {"dtype": self.model_dtype}
        model = tiny_model_factory(
            suite_arch, device=selfspec_device, **dtype, **self.model_overrides
        )
        decoder = Decoder(
            model,
            self.plugin,
            {**self.reach_options, **self.fixed_options},
            plugin_object=self.plugin_object,
            exact=self.exact_mode(),
        )
        plugin = decoder.plugin
        assert_lossless(model, decoder, DECODE_SEQUENCE[0][0], 16)  # the warm-up
        for prompt, max_new_tokens in DECODE_SEQUENCE:
            assert_lossless(model, decoder, prompt, max_new_tokens)
        # sampled decodes on the same instance, the same prompt under two seeds: state keyed
        # without the seed (memoised noise, cached picks) shows up in the second
        from selfspec._engine.contract.sampling import Sampling

        for seed in SAMPLED_SEEDS:
            assert_lossless(
                model, decoder, DECODE_SEQUENCE[0][0], 24, sampling=Sampling(1.0, 0, 0.9, seed)
            )
        assert decoder.plugin is plugin  # one instance throughout

    def exact_mode(self) -> bool:
        """Whether this suite's examples run in exact mode (see :attr:`exact`)."""
        return (
            self.exact
            if self.exact is not None
            else str(self.model_dtype) not in ("None", "torch.float64")
        )

    def test_verify_any_draft(
        self, suite_arch: str, selfspec_device: str, tiny_model_factory: Any
    ) -> None:
        from hypothesis import Phase, example, given, seed, settings
        from hypothesis import strategies as st

        from selfspec._engine.contract.manager import make_manager
        from selfspec._engine.contract.plugins import hook_names
        from selfspec._engine.contract.sampling import Sampling
        from selfspec.testing._anydraft import EVERY_SHAPE, draft_shapes

        pm, instance = make_manager(self.plugin, self.plugin_object)
        if instance is None or "selfspec_verify" not in hook_names(pm, instance):
            pytest.skip(
                f"{self.plugin!r} has no selfspec_verify: the host's verifier checks every draft"
            )
        dtype = {} if self.model_dtype is None else {"dtype": self.model_dtype}
        model = tiny_model_factory(
            suite_arch, device=selfspec_device, **dtype, **self.model_overrides
        )
        base = (
            settings.get_profile(self.hypothesis_profile)
            if self.hypothesis_profile
            else settings.default
        )
        sampling = Sampling(0.8, 0, 0.95, zlib.crc32(f"any:{suite_arch}".encode()))

        def check(shapes: list[Any], sampled: bool, eos_at: int | None) -> None:
            self.check_any_draft_example(
                model, shapes, sampling if sampled else None, eos_at=eos_at
            )

        test = given(
            shapes=st.lists(draft_shapes(), min_size=3, max_size=8),
            sampled=st.booleans(),
            eos_at=st.one_of(st.none(), st.integers(0, ANY_DRAFT_NEW - 1)),
        )(check)
        # explicit examples run last-applied first: every shape, greedy then sampled, then one
        # EOS id drafted where the reference ends with another
        test = example(shapes=list(EVERY_SHAPE), sampled=False, eos_at=ANY_DRAFT_EOS_AT)(test)
        test = example(shapes=list(EVERY_SHAPE[::-1]), sampled=True, eos_at=None)(test)
        test = example(shapes=list(EVERY_SHAPE), sampled=False, eos_at=None)(test)
        if base.derandomize:
            test = seed(zlib.crc32(f"any:{self.plugin}:{suite_arch}".encode()))(test)
        phases = (
            {}
            if self.shrink
            else {"phases": [Phase.explicit, Phase.generate], "report_multiple_bugs": False}
        )
        settings(base, max_examples=max(2, base.max_examples // 6), **phases)(test)()

    def check_any_draft_example(
        self, model: Any, shapes: list[Any], sampling: Any, eos_at: int | None = None
    ) -> None:
        """One decode of ``ANY_DRAFT_PROMPT`` whose drafts are the kit's ``shapes`` in turn
        (:func:`selfspec.testing._anydraft.check_any_drafts`; ``eos_at``: two EOS ids, the
        other one drafted where the reference ends)."""
        from selfspec._engine.contract.audit import LosslessError
        from selfspec._engine.contract.plugins import PluginError
        from selfspec.testing._anydraft import check_any_drafts
        from selfspec.testing._report import with_example

        options = {**self.reach_options, **self.fixed_options}
        try:
            check_any_drafts(
                model,
                self.plugin,
                self.plugin_object,
                options,
                ANY_DRAFT_PROMPT,
                ANY_DRAFT_NEW,
                shapes,
                sampling,
                eos_at,
            )
        except (LosslessError, PluginError) as exc:
            with_example(
                exc,
                {
                    "plugin": self.plugin,
                    "suite": self.suite_name(),
                    "prompt": list(ANY_DRAFT_PROMPT),
                    "max_new_tokens": ANY_DRAFT_NEW,
                    "shapes": [repr(s) for s in shapes],
                    "sampling": repr(sampling),
                    "eos_at": eos_at,
                    "options": options,
                },
            )
            raise

    def test_lossless_offloaded(self, suite_arch: str, offloaded_model_factory: Any) -> None:
        from selfspec._engine.contract.loop import Decoder
        from selfspec._engine.contract.sampling import Sampling
        from selfspec.testing._lossless import assert_lossless

        dtype = {} if self.model_dtype is None else {"dtype": self.model_dtype}
        model = offloaded_model_factory(suite_arch, **dtype, **self.model_overrides)
        decoder = Decoder(
            model,
            self.plugin,
            {**self.offload_options, **self.fixed_options},
            plugin_object=self.plugin_object,
            audit=True,
        )
        assert (
            decoder.runner.placement is not None
            and decoder.runner.placement["offloaded_layers"] > 0
        )
        for prompt, max_new_tokens in OFFLOAD_SEQUENCE:
            assert_lossless(model, decoder, prompt, max_new_tokens)
        assert_lossless(
            model,
            decoder,
            OFFLOAD_SEQUENCE[0][0],
            16,
            sampling=Sampling(1.0, 0, 0.9, SAMPLED_SEEDS[0]),
        )

    def test_lossless_coverage(self) -> None:
        cov = self.coverage()
        if set(self.archs) - cov.done:
            pytest.skip(
                "coverage is checked only when every test_lossless of the class passed in this "
                f"session; not passed (failed or not run): {sorted(set(self.archs) - cov.done)}"
            )
        missing = cov.missing(self.archs, self.coverage_exempt)
        assert not missing, (
            f"the losslessness property of {self.plugin!r} never exercised "
            f"{missing}: widen its options (reach_options, option_strategies) "
            f"or exempt a bucket with a reason (coverage_exempt)\n{cov.report()}"
        )

    # ------------------------------------------------------------------ one example
    def check_example(
        self, model: Any, scenario: Any, options: dict[str, Any], cov: Coverage
    ) -> None:
        """Decode one scenario in audit mode, compare with ``generate``, record coverage."""
        from hypothesis import event

        from selfspec._engine.contract.audit import LosslessError
        from selfspec._engine.contract.plugins import PluginError
        from selfspec._engine.contract.sampling import reference_sample
        from selfspec.testing._lossless import assert_lossless, greedy_reference
        from selfspec.testing._report import with_example
        from selfspec.testing._scenarios import eos_ids

        prompt = list(scenario.prompt)
        eos: tuple[int, ...] = ()
        if scenario.eos_at is not None:
            if scenario.sampling is None:
                ref = greedy_reference(model, prompt, scenario.max_new_tokens)
            else:
                ref = reference_sample(
                    model, prompt, scenario.max_new_tokens, (), scenario.sampling
                )
            eos = eos_ids(ref, scenario.eos_at, scenario.eos_rest, int(model.config.vocab_size))
        window = getattr(model.config, "sliding_window", None)
        if scenario.arch == "qwen2" and not getattr(model.config, "use_sliding_window", False):
            window = None

        def record(result: Any, auditor: Any) -> None:
            for bucket in cov.record(
                scenario.arch,
                len(prompt),
                result,
                auditor,
                window,
                eos,
                sampled=scenario.sampling is not None,
            ):
                event(bucket)

        try:
            assert_lossless(
                model,
                self.plugin,
                prompt,
                scenario.max_new_tokens,
                options,
                plugin_object=self.plugin_object,
                eos_token_ids=eos,
                record=record,
                sampling=scenario.sampling,
                exact=self.exact_mode(),
            )
        except (LosslessError, PluginError) as exc:  # the whole example to a file the message names
            with_example(
                exc,
                {
                    "plugin": self.plugin,
                    "suite": self.suite_name(),
                    "scenario": scenario.as_json(),
                    "options": options,
                    "eos_token_ids": list(eos),
                    "dtype": str(next(model.parameters()).dtype),
                },
            )
            raise
